"""The machine JSON of `cgctl --json topo` and `GET /v1/machine`."""

from __future__ import annotations

import json

import pytest

from computegroups.topology import load_machine, simulated_machine_names
from computegroups.topology.model import Gpu, Link, Machine
from computegroups.topology.serialize import machine_from_dict, machine_to_dict

TOP_KEYS = {"hostname", "source", "driver_version", "cuda_driver_version", "nvswitch", "gpus",
            "nvswitch_fabrics", "links", "nvlink_islands", "numa_nodes", "lost_gpus"}
GPU_KEYS = {"index", "uuid", "name", "memory_mib", "numa_node", "pci_bus_id", "compute_capability",
            "cpu_affinity", "mig_devices"}


def test_stable_keys() -> None:
    doc = machine_to_dict(load_machine("dgx-a100-mig"))
    assert set(doc) >= TOP_KEYS
    assert all(set(g) >= GPU_KEYS for g in doc["gpus"])
    assert len(doc["links"]) == 8 * 7 // 2
    assert doc["links"][0] == {"a": 0, "b": 1, "nvlinks": 12, "pcie": "PXB"}
    assert doc["gpus"][7]["mig_devices"][0]["profile"] == "1g.5gb"
    assert {"uuid", "profile", "memory_mib"} <= set(doc["gpus"][6]["mig_devices"][0])
    assert doc["nvswitch"] is True and doc["nvlink_islands"] == [list(range(8))]
    assert doc["numa_nodes"] == {"0": [0, 1, 2, 3], "1": [4, 5, 6, 7]}
    assert doc["gpus"][0]["compute_capability"] == "8.0"
    assert doc["lost_gpus"] == []


def test_unknown_pcie_is_null() -> None:
    gpus = tuple(Gpu(index=i, uuid=f"GPU-{i}", name="x", pci_bus_id="", memory_mib=None) for i in range(3))
    m = Machine(hostname="h", gpus=gpus, links=(Link(0, 1, 2, None),))
    links = machine_to_dict(m)["links"]
    assert links == [{"a": 0, "b": 1, "nvlinks": 2, "pcie": None},
                     {"a": 0, "b": 2, "nvlinks": 0, "pcie": None},
                     {"a": 1, "b": 2, "nvlinks": 0, "pcie": None}]


@pytest.mark.parametrize("name", simulated_machine_names())
def test_round_trip_through_json(name: str) -> None:
    machine = load_machine(name)
    assert machine_from_dict(json.loads(json.dumps(machine_to_dict(machine)))) == machine


def test_fabrics_are_served_and_read_back_from_an_older_cgd_by_island() -> None:
    machine = load_machine("two-islands-16")
    doc = machine_to_dict(machine)
    assert doc["nvswitch_fabrics"] == [list(range(8)), list(range(8, 16))]
    del doc["nvswitch_fabrics"]  # what a cgd from before fabrics serves
    assert machine_from_dict(doc).nvswitch_fabrics == machine.nvswitch_fabrics
