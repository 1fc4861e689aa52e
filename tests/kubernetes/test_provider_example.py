"""docs/examples/client_example.py on both providers: a simulated cgd and an emulated cluster.

The same program, unchanged, must hold the same groups on either: their
count, devices per group, the shares (memory, compute) and the components.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("lightkube", reason="the Kubernetes provider's tests need lightkube: pip install '.[test]'")
pytest.importorskip("kmock", reason="the emulated cluster needs kmock: pip install '.[test]'")

from computegroups.daemon.client import ComputeGroupManager, LocalComputeResourceProvider
from computegroups.daemon.kubernetes.provider import KubernetesComputeResourceProvider
from tests.daemon_fixture import Cgd, wait_for
from tests.kubernetes.emulator import CLAIMS, PODS, EmulatedCluster

pytestmark = pytest.mark.slow
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "client_example.py"


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("client_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_client_example_holds_the_same_groups_on_cgd_and_on_a_cluster(
        cgd: Cgd, cluster: EmulatedCluster, kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = example().run
    local: list[dict[str, Any]] = asyncio.run(run(ComputeGroupManager(LocalComputeResourceProvider(cgd.socket))))
    local_out = capsys.readouterr().out

    async def on_cluster() -> list[dict[str, Any]]:
        provider = KubernetesComputeResourceProvider(kubeconfig=kubeconfig, allocation_timeout_s=10, poll_s=0.02)
        try:
            held: list[dict[str, Any]] = await run(ComputeGroupManager(provider))
            return held
        finally:
            await provider.close()

    remote = asyncio.run(on_cluster())
    remote_out = capsys.readouterr().out

    assert len(local) == 3
    assert sorted(g["component"] or "" for g in local) == ["", "example-train", "example-train"]
    assert {"component": None, "devices": [(20480, 30)]} in local
    assert remote == local
    for out in (local_out, remote_out):
        assert "refused as expected (unsatisfiable)" in out and out.endswith("released\n")
    assert cluster.objects(PODS) == []
    wait_for(lambda: cluster.objects(CLAIMS) == [], "the claims gone once no pod uses them (their finalizer)")
