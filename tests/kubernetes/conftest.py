"""Fixtures for the Kubernetes provider: an emulated cluster on a real port (tests/kubernetes/emulator.py).

The emulator is imported inside the fixtures: the render tests beside these
need neither kmock nor lightkube. The provider test modules skip themselves,
named, where the `test` extra is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.kubernetes.emulator import EmulatedCluster


@pytest.fixture
def cluster() -> Iterator[EmulatedCluster]:
    """One node `dgx-h100` with eight H100s published by NVIDIA's DRA driver, DeviceTaintRule served."""
    from tests.kubernetes.emulator import EmulatedCluster

    emulated = EmulatedCluster().start()
    yield emulated
    emulated.stop()


@pytest.fixture
def kubeconfig(cluster: EmulatedCluster, tmp_path: Path) -> Path:
    return cluster.kubeconfig(tmp_path / "kubeconfig")
