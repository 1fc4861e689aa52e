"""`list_compute_groups(filters)` on the emulated cluster: cgd's keys, read from the claims and their devices."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lightkube", reason="the Kubernetes provider's tests need lightkube: pip install '.[test]'")
pytest.importorskip("kmock", reason="the emulated cluster needs kmock: pip install '.[test]'")

from computegroups.daemon.client import ComputeGroupManager
from computegroups.daemon.client.providers import GROUP_FILTERS
from computegroups.daemon.kubernetes.cluster_filters import NO_CLUSTER_MEANING
from tests.kubernetes.emulator import EmulatedCluster
from tests.kubernetes.test_provider import on_cluster


def test_every_filter_of_cgd_is_mapped_or_refused_on_a_cluster(tmp_path: Path) -> None:
    emulated = EmulatedCluster({"node-a": 2, "node-b": 2}, products={"node-a": "NVIDIA A100-SXM4-80GB"}).start()
    try:
        async def scenario(m: ComputeGroupManager) -> None:
            a = await m.create_compute_group({"gpus": 1}, node_id="node-a")
            b = await m.allocate_compute_group("train", {"gpus": 2})
            cache = await m.allocate_compute_group("cache", {}, {"group": a.id})
            assert b.document["node"] == "node-b" and cache.id == a.id

            async def ids(**filters: object) -> list[str]:
                return sorted(g.id for g in await m.list_compute_groups(filters))

            assert await ids() == sorted([a.id, b.id])
            assert await ids(model="*a100*") == [a.id], "a case-blind glob over productName"
            assert await ids(model="NVIDIA H100*") == [b.id]
            assert await ids(model="a100*") == [a.id], "the vendor words may be left out, as cgd's placement reads"
            assert await ids(uuid="GPU-node-a-0000") == [a.id]
            assert await ids(uuid="GPU-node-a-0001") == []
            assert await ids(owner="train") == [b.id]
            assert await ids(component="cache") == [a.id], "a component's groups include those it uses"
            assert await ids(component="train", model="*A100*") == [], "every filter must match"
            assert await ids(gpu=1, state="allocated") == [b.id], "an index on any node"
            assert await ids(gpu=0) == sorted([a.id, b.id])
            assert await ids(deployment="web") == [], "no claim of the provider's belongs to a deployment"
            for key in NO_CLUSTER_MEANING:
                with pytest.raises(ValueError, match=f"^{key}: not a filter on a cluster"):
                    await m.list_compute_groups({key: "fast"})
            with pytest.raises(ValueError, match="unknown filter 'colour'"):
                await m.list_compute_groups({"colour": "red"})

        on_cluster(emulated.kubeconfig(tmp_path / "kubeconfig"), scenario)
    finally:
        emulated.stop()
    assert set(NO_CLUSTER_MEANING) < set(GROUP_FILTERS)
