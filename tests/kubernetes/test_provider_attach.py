"""Components attached to a group made on its own (`"group": ID`), on the emulated cluster.

DRA shares an allocated claim among the pods that reference it: the attached
component gets a holder pod per replica on the group's claim, and every read
of the provider sees it as cgd's reads see a user of a group.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lightkube", reason="the Kubernetes provider's tests need lightkube: pip install '.[test]'")
pytest.importorskip("kmock", reason="the emulated cluster needs kmock: pip install '.[test]'")

from computegroups.daemon.client import ComputeGroupManager
from computegroups.daemon.kubernetes.cluster_errors import ClusterError
from tests.daemon_fixture import wait_for
from tests.kubernetes.emulator import CLAIMS, PODS, EmulatedCluster
from tests.kubernetes.test_provider import on_cluster


def test_a_component_attaches_to_a_group_by_id_with_holder_pods_on_its_claim(
        cluster: EmulatedCluster, kubeconfig: Path) -> None:
    async def scenario(m: ComputeGroupManager) -> None:
        share = await m.create_compute_group({"memory_mib": 10240})
        group = await m.allocate_compute_group("cache", {}, {"group": share.id, "replicas": 2})
        assert group.id == share.id and group.users == ["cache/0", "cache/1"]
        assert [g.id for g in await m.get_component_allocations("cache")] == [share.id]
        (component,) = [c for c in await m.provider.list_components() if c["name"] == "cache"]
        assert [(r["index"], r["group"]) for r in component["replicas"]] == [(0, share.id), (1, share.id)]
        summary = await m.get_allocation_summary()
        assert summary["memory_allocated_mib"] == 10240, "the group's capacity is counted once"
        pods = {p["metadata"]["name"]: p for p in cluster.objects(PODS)}
        assert sorted(pods) == sorted([f"{share.id}-holder", "cache-0-holder", "cache-1-holder"])
        assert pods["cache-1-holder"]["spec"]["resourceClaims"] == [
            {"name": "group", "resourceClaimName": share.id}]
        assert pods["cache-1-holder"]["metadata"]["labels"]["computegroups.io/component"] == "cache"

        for free in (m.delete_compute_group, m.deallocate_compute_group):
            with pytest.raises(ClusterError) as used:
                await free(share.id)
            assert (used.value.code, used.value.message) == (
                "conflict", f"group {share.id!r} is in use by 'cache' (cache/0, cache/1): release it first")
        with pytest.raises(ClusterError, match="already exists"):
            await m.allocate_compute_group("cache", {"gpus": 1})
        with pytest.raises(ValueError, match="not groups of cache"):
            await m.provider.deallocate_resources("cache", ["other"])

        assert await m.provider.deallocate_resources("cache", [])
        assert (await m.get_compute_group(share.id)).users == []
        assert await m.get_component_allocations("cache") == []
        assert await m.delete_compute_group(share.id)

    on_cluster(kubeconfig, scenario)
    assert cluster.objects(PODS) == []
    wait_for(lambda: cluster.objects(CLAIMS) == [], "the claim gone once no pod uses it")


def test_only_an_allocated_group_made_on_its_own_takes_users(cluster: EmulatedCluster, kubeconfig: Path) -> None:
    async def scenario(m: ComputeGroupManager) -> None:
        train = await m.allocate_compute_group("train", {"gpus": 1})
        with pytest.raises(ClusterError, match="belongs to component 'train'"):
            await m.allocate_compute_group("side", {}, {"group": train.id})
        with pytest.raises(ClusterError) as missing:
            await m.allocate_compute_group("side", {}, {"group": "group-00000000"})
        assert missing.value.code == "not_found"
        with pytest.raises(ValueError, match=r"^claim: not allowed with group"):
            await m.provider.allocate_resources("side", {"group": train.id, "claim": {"gpus": 1}})
        share = await m.create_compute_group({"gpus": 1})
        assert await m.drain_compute_group(share.id)
        with pytest.raises(ClusterError, match=f"group '{share.id}' is draining: nothing new attaches to it "
                                               r"\(side/0\)"):
            await m.allocate_compute_group("side", {}, {"group": share.id})

    on_cluster(kubeconfig, scenario)
    assert not [p for p in cluster.objects(PODS) if p["metadata"]["name"].startswith("side")]


def test_an_attached_replica_runs_on_the_node_of_the_groups_devices(tmp_path: Path) -> None:
    emulated = EmulatedCluster({"node-a": 2, "node-b": 2}).start()
    try:
        async def scenario(m: ComputeGroupManager) -> None:
            share = await m.create_compute_group({"gpus": 1}, node_id="node-b")
            await m.allocate_compute_group("cache", {}, {"group": share.id})

        on_cluster(emulated.kubeconfig(tmp_path / "kubeconfig"), scenario)
        wait_for(lambda: {p["metadata"]["name"]: p["spec"].get("nodeName") for p in emulated.objects(PODS)}.get(
            "cache-0-holder") == "node-b", "the attached holder scheduled beside its claim's devices")
        (claim,) = emulated.objects(CLAIMS)
        assert sorted(r["name"] for r in claim["status"]["reservedFor"]) == ["cache-0-holder",
                                                                             claim["metadata"]["name"] + "-holder"]
    finally:
        emulated.stop()
