"""Issue 17's selectors and sharing modes through the provider: the render's claim spec, refused up front
where no node's devices are admitted, and what has no cluster form refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lightkube", reason="the Kubernetes provider's tests need lightkube: pip install '.[test]'")
pytest.importorskip("kmock", reason="the emulated cluster needs kmock: pip install '.[test]'")

from computegroups.daemon.client import ComputeGroupManager
from computegroups.daemon.kubernetes.cluster_errors import ClusterError
from computegroups.daemon.kubernetes.render_claims import claim_template_spec
from computegroups.daemon.model.claims import Claim
from tests.kubernetes.emulator import CLAIMS, EmulatedCluster
from tests.kubernetes.test_provider import on_cluster


def test_a_claims_selectors_reach_the_cluster_as_the_render_gives_them(
        cluster: EmulatedCluster, kubeconfig: Path) -> None:
    asked = {"gpus": 2, "model": "*h100*", "min_memory_mib": "79GiB", "compute_capability": "9.0", "same": "model"}

    async def scenario(m: ComputeGroupManager) -> None:
        group = await m.allocate_compute_group("train", asked)
        assert group.allocation_state == "allocated" and group.resources["gpus"] == 2
        whole = await m.create_compute_group({"memory_mib": 20480, "share": "whole"})
        assert [(d["whole"], d["memory_mib"]) for d in whole.devices] == [(True, 81559)], "all of the device"

    on_cluster(kubeconfig, scenario)
    (claim,) = [c for c in cluster.objects(CLAIMS) if c["metadata"]["name"] == "train-0"]
    assert claim["spec"] == claim_template_spec(Claim.from_dict(asked), "dra")
    assert claim["spec"]["devices"]["constraints"] == [{"matchAttribute": "gpu.nvidia.com/productName"}]


@pytest.mark.parametrize("asked", [
    {"gpus": 1, "model": "*A100*"},
    {"gpus": 1, "min_memory_mib": "96GiB"},
    {"gpus": 1, "compute_capability": "10.0"},
    {"memory_mib": 1024, "model": "*L40S*"},
])
def test_a_claim_whose_selectors_admit_no_device_is_refused_up_front(
        cluster: EmulatedCluster, kubeconfig: Path, asked: dict[str, object]) -> None:
    async def scenario(m: ComputeGroupManager) -> None:
        with pytest.raises(ClusterError) as never:
            await m.allocate_compute_group("odd", asked)
        assert never.value.code == "unsatisfiable"

    on_cluster(kubeconfig, scenario)
    assert cluster.objects(CLAIMS) == []


def test_same_model_needs_enough_devices_of_one_model_on_a_node(tmp_path: Path) -> None:
    emulated = EmulatedCluster({"node-a": 2, "node-b": 2}, products={"node-a": "NVIDIA A100-SXM4-80GB"}).start()
    try:
        async def scenario(m: ComputeGroupManager) -> None:
            group = await m.allocate_compute_group("pair", {"gpus": 2, "same": "model"})
            assert group.allocation_state == "allocated"
            with pytest.raises(ClusterError) as never:
                await m.allocate_compute_group("four", {"gpus": 3, "same": "model"})
            assert never.value.code == "unsatisfiable"

        on_cluster(emulated.kubeconfig(tmp_path / "kubeconfig"), scenario)
    finally:
        emulated.stop()


def test_cpus_cpu_bind_and_a_mig_memory_floor_are_refused_by_name(cluster: EmulatedCluster, kubeconfig: Path) -> None:
    async def scenario(m: ComputeGroupManager) -> None:
        for claim, key in (({"cpus": 4}, "cpus"), ({"gpus": 1, "cpus": 4}, "cpus"),
                           ({"mig": "1g.10gb", "min_memory_mib": 40960}, "min_memory_mib")):
            with pytest.raises(ValueError, match=f"^{key}: not supported by the Kubernetes provider"):
                await m.allocate_compute_group("odd", claim)
        with pytest.raises(ValueError, match=r"^cpu_bind: not supported by the Kubernetes provider \(CPU"):
            await m.allocate_compute_group("odd", {"gpus": 1}, {"cpu_bind": "numa"})

    on_cluster(kubeconfig, scenario)
    assert cluster.objects(CLAIMS) == []


def test_share_any_is_the_share_where_devices_are_shareable_else_a_whole_device(
        cluster: EmulatedCluster, kubeconfig: Path, tmp_path: Path) -> None:
    async def shared(m: ComputeGroupManager) -> None:
        group = await m.create_compute_group({"memory_mib": 20480, "share": "any"})
        assert [(d["whole"], d["memory_mib"]) for d in group.devices] == [(False, 20480)]

    on_cluster(kubeconfig, shared)
    emulated = EmulatedCluster({"n": 2}, shareable=False).start()  # NVIDIA's driver today
    try:
        async def whole(m: ComputeGroupManager) -> None:
            group = await m.create_compute_group({"memory_mib": 20480, "share": "any"})
            assert [(d["whole"], d["memory_mib"]) for d in group.devices] == [(True, 81559)], "its whole subrequest"
            share = await m.create_compute_group({"memory_mib": 20480})
            assert share.allocation_state == "pending", "a capacity request needs shareable devices"

        on_cluster(emulated.kubeconfig(tmp_path / "kubeconfig"), whole, timeout=0.3)
    finally:
        emulated.stop()
