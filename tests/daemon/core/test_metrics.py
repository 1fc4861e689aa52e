"""The scrape-time gauges of `StateCollector`, on a state and a health sample built by hand."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from computegroups.daemon.core.metrics import StateCollector
from computegroups.statefiles.schema import StateDoc
from computegroups.topology import load_machine


def test_a_gpu_nvml_lists_and_discovery_did_not_is_skipped_not_fatal() -> None:
    machine = load_machine("dgx-h100")
    unknown = max(g.index for g in machine.gpus) + 1
    keeper = SimpleNamespace(machine=machine)
    manager: Any = SimpleNamespace(keeper=keeper, doc=StateDoc())
    health: Any = SimpleNamespace(used_by_replica=lambda: {0: {"train/0": 100}, unknown: {"other/0": 5}})
    (family,) = StateCollector(manager, health, "test")._workers()
    assert [(s.labels["component"], s.labels["gpu"], s.value) for s in family.samples] == [
        ("train", "0", 100 * 1024 * 1024)]
