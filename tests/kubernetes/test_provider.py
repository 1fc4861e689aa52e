"""The Kubernetes provider over real HTTP against an emulated API server, the test as the scheduler."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("lightkube", reason="the Kubernetes provider's tests need lightkube: pip install '.[test]'")
pytest.importorskip("kmock", reason="the emulated cluster needs kmock: pip install '.[test]'")

from computegroups.daemon.client import ComputeGroupManager
from computegroups.daemon.kubernetes.cluster_errors import (
    ClusterError,
    ClusterUnreachable,
    NotSupportedByCluster,
)
from computegroups.daemon.kubernetes.provider import KubernetesComputeResourceProvider
from tests.daemon_fixture import wait_for
from tests.kubernetes.emulator import CLAIMS, HOLD_REASON, NAMESPACE, PODS, EmulatedCluster, write_kubeconfig

T = TypeVar("T")
MANAGED = {"app.kubernetes.io/managed-by": "computegroups"}


def on_cluster(kubeconfig: Path, scenario: Callable[[ComputeGroupManager], Awaitable[T]],
               timeout: float = 10.0) -> T:
    """Run `scenario` with a manager on the emulated cluster, its client closed after; a scenario
    that hangs (a watch that never ends) fails after a minute rather than holding the suite."""
    async def run() -> T:
        provider = KubernetesComputeResourceProvider(kubeconfig=kubeconfig, allocation_timeout_s=timeout,
                                                     poll_s=0.02)
        try:
            return await asyncio.wait_for(scenario(ComputeGroupManager(provider)), 60)
        finally:
            await provider.close()
    return asyncio.run(run())


def test_nodes_and_devices_come_from_nodes_and_resource_slices(cluster: EmulatedCluster, kubeconfig: Path) -> None:
    async def scenario(m: ComputeGroupManager) -> None:
        (node,) = await m.list_compute_nodes()
        assert node.id == "dgx-h100"
        assert node.resources["gpus"] == 8 and node.resources["memory_mib"] == 8 * 81559
        assert node.resources["models"] == {"NVIDIA H100 80GB HBM3": 8}
        assert node.resources["devices"][3]["uuid"] == "GPU-dgx-h100-0003"
        assert node.utilization == {"memory_allocated": 0.0, "memory_foreign": 0.0, "compute_allocated": 0.0,
                                    "memory_used": None, "gpu_utilization": None, "memory_utilization": None}

    on_cluster(kubeconfig, scenario)


def test_allocate_makes_a_labelled_claim_and_a_holder_and_reads_the_allocation(
        cluster: EmulatedCluster, kubeconfig: Path) -> None:
    async def scenario(m: ComputeGroupManager) -> None:
        group = await m.allocate_compute_group("train", {"gpus": 2}, {"replicas": 2})
        assert group.id == "train-0" and group.allocation_state == "allocated" and group.component == "train"
        assert group.resources["gpus"] == 2 and group.document["node"] == "dgx-h100"
        owned = await m.get_component_allocations("train")
        assert [g.id for g in owned] == ["train-0", "train-1"]
        assert not set(owned[0].gpu_indices) & set(owned[1].gpu_indices)
        assert owned[1].utilization["compute_allocated"] == 1.0
        share = await m.create_compute_group({"memory_mib": "20GiB", "compute_pct": 30})
        assert share.component is None
        (device,) = share.devices
        assert (device["memory_mib"], device["compute_pct"], device["whole"]) == (20480, 30, False)

    on_cluster(kubeconfig, scenario)
    claims = {c["metadata"]["name"]: c for c in cluster.objects(CLAIMS)}
    assert sorted(claims) == sorted(["train-0", "train-1", *[n for n in claims if n.startswith("group-")]])
    train = claims["train-0"]
    assert train["metadata"]["labels"] == {**MANAGED, "computegroups.io/component": "train",
                                           "computegroups.io/replica": "0", "computegroups.io/scope": "per-replica"}
    # the spec `cgctl render kubernetes` gives the same claim
    assert train["spec"] == {"devices": {"requests": [
        {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}]}}
    share = next(c for n, c in claims.items() if n.startswith("group-"))
    assert share["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {
        "requests": {"memory": "20Gi", "compute": "30"}}
    holders = {p["metadata"]["name"]: p for p in cluster.objects(PODS)}
    assert holders["train-1-holder"]["spec"]["resourceClaims"] == [{"name": "group", "resourceClaimName": "train-1"}]
    assert holders["train-1-holder"]["spec"]["containers"][0]["resources"] == {"claims": [{"name": "group"}]}


def test_a_share_under_mps_is_nvidias_gpu_config_and_reads_back_the_same(
        cluster: EmulatedCluster, kubeconfig: Path) -> None:
    async def scenario() -> None:
        provider = KubernetesComputeResourceProvider(kubeconfig=kubeconfig, sharing="mps", poll_s=0.02)
        try:
            manager = ComputeGroupManager(provider)
            share = await manager.create_compute_group({"memory_mib": 20480, "compute_pct": 30})
        finally:
            await provider.close()
        (device,) = share.devices
        assert (device["memory_mib"], device["compute_pct"], device["whole"]) == (20480, 30, False)

    asyncio.run(scenario())
    (claim,) = cluster.objects(CLAIMS)
    assert "capacity" not in claim["spec"]["devices"]["requests"][0]["exactly"]
    mps = claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]
    assert mps == {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {
        "strategy": "MPS",
        "mpsConfig": {"defaultActiveThreadPercentage": 30, "defaultPinnedDeviceMemoryLimit": "20Gi"}}}


def test_an_unallocated_claim_answers_a_pending_group_with_the_schedulers_reason(
        cluster: EmulatedCluster, kubeconfig: Path) -> None:
    cluster.scheduling = "hold"

    async def scenario(m: ComputeGroupManager) -> None:
        group = await m.allocate_compute_group("big", {"gpus": 4})
        assert group.allocation_state == "pending" and group.devices == []
        assert group.document["explanation"] == HOLD_REASON
        (component,) = await m.provider.list_components()
        assert component["state"] == "scheduling" and component["queue"] == {"reason": HOLD_REASON}
        with pytest.raises(TimeoutError, match="cannot allocate all claims"):
            await m.provider.wait_component("big", "placed", 0.1)
        cluster.scheduling = "allocate"  # capacity came back: the scheduler places the waiting claim
        placed = await m.provider.wait_component("big", "placed", 10)
        assert placed["state"] == "allocated" and len(placed["replicas"][0]["devices"]) == 4

    on_cluster(kubeconfig, scenario, timeout=0.3)


def test_deallocate_and_delete_remove_claim_and_holder(cluster: EmulatedCluster, kubeconfig: Path) -> None:
    async def scenario(m: ComputeGroupManager) -> None:
        group = await m.allocate_compute_group("web", {"gpus": 1}, {"replicas": 2})
        share = await m.create_compute_group({"memory_mib": 1024})
        with pytest.raises(ClusterError) as taken:
            await m.allocate_compute_group("web", {"gpus": 1})
        assert taken.value.code == "conflict"
        with pytest.raises(ClusterError) as owned:
            await m.delete_compute_group(group.id)
        assert owned.value.code == "conflict"
        assert await m.deallocate_compute_group(group.id)
        assert sorted(g.id for g in await m.list_compute_groups()) == sorted(["web-1", share.id]), "one freed alone"
        assert await m.deallocate_compute_group("web-1")
        assert await m.delete_compute_group(share.id)
        assert not await m.delete_compute_group(share.id)
        assert not await m.deallocate_compute_group(group.id)
        assert await m.list_compute_groups() == []
        with pytest.raises(ClusterError) as missing:
            await m.get_compute_group(group.id)
        assert missing.value.code == "not_found"

    on_cluster(kubeconfig, scenario)
    assert cluster.objects(PODS) == []
    wait_for(lambda: cluster.objects(CLAIMS) == [], "the claims gone once no pod uses them (their finalizer)")


def test_a_claim_no_node_can_hold_is_refused_up_front(cluster: EmulatedCluster, kubeconfig: Path) -> None:
    async def scenario(m: ComputeGroupManager) -> None:
        with pytest.raises(ClusterError) as never:
            await m.allocate_compute_group("huge", {"gpus": 64})
        assert never.value.code == "unsatisfiable"
        for key, value in (("gpu_ids", [0]), ("pool", "fast"), ("command", ["python"])):
            with pytest.raises(ValueError, match=f"^{key}: not supported by the Kubernetes provider"):
                await m.allocate_compute_group("odd", {"gpus": 1}, {key: value})

    on_cluster(kubeconfig, scenario)
    assert cluster.objects(CLAIMS) == []


def test_drain_creates_a_no_schedule_device_taint_rule(cluster: EmulatedCluster, kubeconfig: Path) -> None:
    async def scenario(m: ComputeGroupManager) -> None:
        group = await m.allocate_compute_group("train", {"gpus": 2})
        assert await m.drain_compute_group(group.id)
        drained = await m.get_compute_group(group.id)
        assert drained.allocation_state == "draining"
        assert [g.id for g in await m.list_compute_groups({"state": "draining"})] == [group.id]
        summary = await m.get_allocation_summary()
        assert sorted(summary["gpus_drained"]) == group.gpu_indices
        # the scheduler reads the taints: a new claim lands on other devices
        other = await m.allocate_compute_group("next", {"gpus": 6})
        assert not set(other.gpu_indices) & set(group.gpu_indices)
        assert await m.deallocate_compute_group(group.id)

    on_cluster(kubeconfig, scenario)
    rules = cluster.objects(cluster.taints)
    assert rules == []  # the group's rules went with it


def test_drain_where_the_cluster_serves_no_device_taints_says_so(tmp_path: Path) -> None:
    emulated = EmulatedCluster(taint_api=None).start()
    try:
        async def scenario(m: ComputeGroupManager) -> None:
            group = await m.allocate_compute_group("train", {"gpus": 1})
            with pytest.raises(NotSupportedByCluster, match="not supported by this cluster"):
                await m.drain_compute_group(group.id)

        on_cluster(emulated.kubeconfig(tmp_path / "kubeconfig"), scenario)
    finally:
        emulated.stop()


def test_an_unreachable_cluster_is_one_clear_error(tmp_path: Path) -> None:
    config = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9")  # the discard port: nothing answers

    async def scenario(m: ComputeGroupManager) -> Any:
        return await m.list_compute_groups()

    with pytest.raises(ClusterUnreachable, match=r"^cannot reach the cluster's API server at http://127\.0\.0\.1:9: "):
        on_cluster(config, scenario)


def test_each_node_of_a_cluster_is_a_compute_node_with_its_own_gpus_and_groups(tmp_path: Path) -> None:
    emulated = EmulatedCluster({"node-a": 2, "node-b": 4}).start()
    try:
        async def scenario(m: ComputeGroupManager) -> None:
            group = await m.allocate_compute_group("train", {"gpus": 3})
            assert group.document["node"] == "node-b" and group.utilization["compute_allocated"] == 1.0
            a, b = sorted(await m.list_compute_nodes(), key=lambda n: n.id)
            assert (a.id, a.resources["gpus"], a.compute_groups) == ("node-a", 2, [])
            assert (b.id, b.resources["gpus"], [g.id for g in b.compute_groups]) == ("node-b", 4, ["train-0"])
            assert b.utilization["compute_allocated"] == 0.75 and a.utilization["compute_allocated"] == 0.0
            pinned = await m.create_compute_group({"gpus": 1}, node_id="node-a")
            assert pinned.document["node"] == "node-a"

        on_cluster(emulated.kubeconfig(tmp_path / "kubeconfig"), scenario)
    finally:
        emulated.stop()


def test_with_wait_the_allocation_waits_for_the_scheduler_like_salloc(
        cluster: EmulatedCluster, kubeconfig: Path) -> None:
    cluster.scheduling = "hold"

    def scheduler_said_no() -> bool:
        return any(c.get("status") == "False" for p in cluster.objects(PODS)
                   for c in p.get("status", {}).get("conditions", []))

    async def scenario(m: ComputeGroupManager) -> None:
        waiting = asyncio.ensure_future(m.allocate_compute_group("train", {"gpus": 2}, {"wait": True}))
        while not scheduler_said_no():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)
        assert not waiting.done()  # no answer while the scheduler says no, however long that is
        cluster.scheduling = "allocate"
        group = await waiting
        assert group.allocation_state == "allocated" and group.resources["gpus"] == 2

    on_cluster(kubeconfig, scenario, timeout=0.05)


def test_a_name_freed_a_moment_ago_can_be_allocated_again(cluster: EmulatedCluster, kubeconfig: Path) -> None:
    """An allocated claim keeps its delete-protection finalizer until the controller sees no pod
    use it: a new claim of the same name waits for the old one to go instead of failing on a conflict."""
    async def scenario(m: ComputeGroupManager) -> None:
        group = await m.allocate_compute_group("web", {"gpus": 1})
        cluster.claim_controller = False
        assert await m.deallocate_compute_group(group.id)
        assert await m.list_compute_groups() == []  # going: not listed, though still there
        assert [c["metadata"]["name"] for c in cluster.objects(CLAIMS)] == ["web-0"]
        reads = ("GET", "/apis/resource.k8s.io/v1/namespaces/cg-test/resourceclaims/web-0")
        before = cluster.requests().count(reads)
        again = asyncio.ensure_future(m.allocate_compute_group("web", {"gpus": 1}))
        while not again.done() and cluster.requests().count(reads) < before + 2:  # looked, looks again
            await asyncio.sleep(0.01)
        assert not again.done()
        cluster.claim_controller = True
        assert (await again).allocation_state == "allocated"

    on_cluster(kubeconfig, scenario)


def test_a_replica_the_api_server_refuses_takes_the_ones_made_before_it(
        cluster: EmulatedCluster, kubeconfig: Path) -> None:
    """Someone else's claim holds the name of replica 1: the allocation fails whole."""
    async def scenario(m: ComputeGroupManager) -> None:
        await m.allocate_compute_group("other", {"gpus": 1})
        cluster.call(lambda: claim_like(cluster, "other-0", "web-1"))
        with pytest.raises(ClusterError) as taken:
            await m.allocate_compute_group("web", {"gpus": 1}, {"replicas": 2})
        assert taken.value.code == "conflict"

    on_cluster(kubeconfig, scenario)
    wait_for(lambda: sorted(c["metadata"]["name"] for c in cluster.objects(CLAIMS)) == ["other-0", "web-1"],
             "only the claims that were there before")
    assert sorted(p["metadata"]["name"] for p in cluster.objects(PODS)) == ["other-0-holder"]


async def claim_like(cluster: EmulatedCluster, old: str, new: str) -> None:
    """A claim named `new` that is not computegroups' (no labels), beside `old`."""
    assert cluster.emulator is not None
    async with cluster.emulator._lock:
        found = next(o for (r, _, name), o in cluster.emulator.objects.items() if r == CLAIMS and name == old)
        copy = {**found.raw, "metadata": {"name": new, "namespace": found.raw["metadata"]["namespace"]}}
        cluster.emulator.objects[CLAIMS, copy["metadata"]["namespace"], new] = copy


@pytest.mark.parametrize("wait", [False, True], ids=["answer-pending", "wait-like-salloc"])
def test_cancelled_while_the_scheduler_holds_the_claim_the_allocation_leaves_nothing(
        cluster: EmulatedCluster, kubeconfig: Path, wait: bool) -> None:
    """Ctrl-C (a cancelled task) while waiting for the scheduler: the claims and holders it made go
    (with `wait` too, however long it has waited, as cgd drops a queued claim whose asker left)."""
    cluster.scheduling = "hold"

    async def scenario(m: ComputeGroupManager) -> None:
        loop = asyncio.get_running_loop()
        past_timeout = loop.time() + 0.3  # with wait: past allocation_timeout_s, still waiting
        task = asyncio.ensure_future(m.allocate_compute_group("train", {"gpus": 1}, {"replicas": 2, "wait": wait}))
        while len(cluster.objects(PODS)) < 2 or (wait and loop.time() < past_timeout):
            await asyncio.sleep(0.02)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    on_cluster(kubeconfig, scenario, timeout=60 if not wait else 0.05)
    assert cluster.objects(PODS) == []
    wait_for(lambda: cluster.objects(CLAIMS) == [], "the claims gone")


def test_a_holder_refused_for_anothers_pod_of_its_name_leaves_that_pod(
        cluster: EmulatedCluster, kubeconfig: Path) -> None:
    """Only what the call made is taken back: the pod that took the holder's name stays."""
    cluster.call(lambda: foreign_pod(cluster, "train-0-holder"))

    async def scenario(m: ComputeGroupManager) -> None:
        with pytest.raises(ClusterError) as taken:
            await m.allocate_compute_group("train", {"gpus": 1})
        assert taken.value.code == "conflict"

    on_cluster(kubeconfig, scenario)
    assert [p["metadata"]["name"] for p in cluster.objects(PODS)] == ["train-0-holder"]
    assert cluster.objects(CLAIMS) == []


async def foreign_pod(cluster: EmulatedCluster, name: str) -> None:
    """A pod that is not computegroups' (no labels), named as a holder will be."""
    assert cluster.emulator is not None
    async with cluster.emulator._lock:
        cluster.emulator.objects[PODS, NAMESPACE, name] = {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE, "uid": "foreign"},
            "spec": {"containers": [{"name": "web", "image": "nginx"}]}}


def test_gpu_status_has_cgds_keys_so_both_providers_answer_one_shape(
        cluster: EmulatedCluster, kubeconfig: Path) -> None:
    from computegroups.daemon.core.views import gpu_status
    from computegroups.statefiles.schema import StateDoc
    from computegroups.topology import load_machine

    async def scenario(m: ComputeGroupManager) -> list[dict[str, Any]]:
        await m.allocate_compute_group("train", {"gpus": 1})
        return list((await m.provider.get_resource_state())["gpus"])

    gpus = on_cluster(kubeconfig, scenario)
    local = gpu_status(load_machine("dgx-h100"), StateDoc(), {})[0]
    assert set(local) <= set(gpus[0]) and set(gpus[0]) - set(local) == {"node", "device"}
    assert gpus[0]["held_by_lost"] == [] and gpus[0]["groups"] == ["train-0"]
    assert gpus[0]["exclusive_owner"] == "train" and [c["name"] for c in gpus[0]["components"]] == ["train"]
    assert gpus[1]["groups"] == [] and gpus[1]["exclusive_owner"] is None
