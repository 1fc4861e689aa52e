"""The Kubernetes provider on a real cluster, opt-in: `CG_TEST_KUBECONFIG=PATH` (and
`CG_TEST_NAMESPACE`, default `default`), a cluster with NVIDIA's DRA driver and one
free GPU (kind with the driver, for example). The real scheduler allocates here."""

from __future__ import annotations

import asyncio
import os

import pytest

KUBECONFIG = os.environ.get("CG_TEST_KUBECONFIG")
pytestmark = pytest.mark.skipif(
    not KUBECONFIG, reason="CG_TEST_KUBECONFIG is not set: no real cluster to test the Kubernetes provider on")


def test_a_gpu_claimed_drained_and_given_back_on_a_real_cluster() -> None:
    pytest.importorskip("lightkube", reason="the Kubernetes provider needs lightkube: pip install '.[test]'")
    from computegroups.daemon.client import ComputeGroupManager
    from computegroups.daemon.kubernetes.cluster_errors import NotSupportedByCluster
    from computegroups.daemon.kubernetes.provider import KubernetesComputeResourceProvider

    async def scenario() -> None:
        provider = KubernetesComputeResourceProvider(
            kubeconfig=KUBECONFIG, namespace=os.environ.get("CG_TEST_NAMESPACE", "default"),
            allocation_timeout_s=180)
        m = ComputeGroupManager(provider)
        try:
            nodes = await m.list_compute_nodes()
            assert nodes and all(n.resources["gpus"] for n in nodes), "no node publishes gpu.nvidia.com devices"
            group = await m.allocate_compute_group("cg-real-test", {"gpus": 1})
            assert group.allocation_state == "allocated", group.document["explanation"]
            (device,) = group.devices
            assert str(device["uuid"]).startswith("GPU-") and device["node"] in {n.id for n in nodes}
            if await provider.taint_rule_version() is None:
                with pytest.raises(NotSupportedByCluster):
                    await m.drain_compute_group(group.id)
            else:
                assert await m.drain_compute_group(group.id)
                assert (await m.get_compute_group(group.id)).allocation_state == "draining"
        finally:
            await m.provider.deallocate_resources("cg-real-test", [])
            assert await m.list_compute_groups({"component": "cg-real-test"}) == []
            await provider.close()

    asyncio.run(scenario())
