"""Machine files: every shipped one loads; every mistake names file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from computegroups.topology.machinefile import (
    MachineFileError,
    load_machine_spec,
    parse_machine_file,
    simulated_machine_names,
)
from computegroups.topology.model import PcieLevel
from computegroups.topology.ranges import format_ranges, parse_ranges

SHIPPED = {"dgx-h100", "dgx1-v100", "workstation-4x-pcie", "workstation-nvlink-pairs",
           "dgx-a100-mig", "cpu-only", "synthetic-72"}

MINIMAL = """
gpu_count = 4
[gpu_defaults]
name = "Test GPU"
memory_mib = 1000
"""


def test_every_shipped_machine_loads() -> None:
    assert set(simulated_machine_names()) >= SHIPPED
    for name in simulated_machine_names():
        spec = load_machine_spec(name)
        assert spec.name == name
        assert spec.label == f"{name}.toml"


def test_a_path_works_like_a_name(tmp_path: Path) -> None:
    path = tmp_path / "mybox.toml"
    path.write_text(MINIMAL)
    spec = load_machine_spec(str(path))
    assert spec.name == "mybox"
    assert [g.memory_mib for g in spec.gpus] == [1000] * 4
    assert len({g.uuid for g in spec.gpus}) == 4
    assert len({g.pci_bus_id for g in spec.gpus}) == 4


def test_simulate_says_what_workers_use(tmp_path: Path) -> None:
    spec = parse_machine_file(MINIMAL + "[simulate]\nworker_memory_mib = 512\nworker_utilization_pct = 20\n",
                              "mybox.toml")
    assert (spec.worker_memory_mib, spec.worker_utilization_pct) == (512, 20)
    plain = parse_machine_file(MINIMAL, "mybox.toml")
    assert (plain.worker_memory_mib, plain.worker_utilization_pct) == (None, None)


def test_unknown_name_lists_the_shipped_ones() -> None:
    with pytest.raises(MachineFileError) as err:
        load_machine_spec("dgx-9000")
    assert "dgx-9000" in str(err.value)
    assert "dgx1-v100" in str(err.value)


def test_uuids_are_stable_across_loads() -> None:
    assert load_machine_spec("synthetic-72") == load_machine_spec("synthetic-72")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('[gpus.3]\nmemory_mib = "lots"', "gpus[3].memory_mib: expected an integer, got 'lots'"),
        ("[gpus.1-2]\nmemory_mib = 1.5", "gpus[1-2].memory_mib: expected an integer, got 1.5"),
        ("[gpus.2]\nmemory_mib = 0", "gpus[2].memory_mib: expected an integer >= 1, got 0"),
        ("[gpus.9]\nname = 'x'", "gpus[9]: index 9 out of range"),
        ("[gpus.0-1]\nuuid = 'GPU-x'", "gpus[0-1].uuid: set only for a single GPU ([gpus.N]), not for a range"),
        ("[gpus.2]\nuuid = 'GPU-x'\n[gpus.3]\nuuid = 'GPU-x'", "gpus[3].uuid: GPU-x is also used by GPU 2"),
        ("colour = 'red'", "mybox.toml: colour: unknown field (known: cuda_driver_version, driver_version,"),
        ("[gpus.0]\nmig = [{profile = '1g', memory_mib = 1, colour = 1}]", "gpus[0].mig[0].colour: unknown field"),
        ("[gpus.0]\nnvlink_ports = 0\n[nvlink.pairs]\n0-1 = 1", "gpus[0].nvlink_ports: GPU 0 uses 1 NVLinks"),
        ("[nvlink.pairs]\n0-9 = 1", "nvlink.pairs.0-9: not a pair of two distinct GPUs below 4"),
        ("[nvlink.pairs]\n1-1 = 1", "nvlink.pairs.1-1: not a pair"),
        ("[nvlink.pairs]\nzero-one = 1", "nvlink.pairs.zero-one: expected a GPU pair"),
        ("[nvlink.pairs]\n0-1 = -1", "nvlink.pairs.0-1: expected an integer >= 0, got -1"),
        ("[[nvlink.mesh]]\ngpus = '0-3'", "nvlink.mesh[0].links: missing"),
        ("[pcie]\nsame_numa = 'NEAR'", "pcie.same_numa: unknown PCIe level"),
        ("[pcie.pairs]\n0-1 = 'FAR'", "pcie.pairs.0-1: unknown PCIe level"),
        ("[pcie.groups]\nPIX = ['0-7']", "pcie.groups.PIX[0]: index 7 out of range"),
        ("[[numa]]\ngpus = '0-1'\n[[numa]]\ngpus = '1-2'", "numa[1].gpus: GPU 1 is already on NUMA node 0"),
        ("[[numa]]\ncpus = '3-1'", "numa[0].cpus:"),
        ("pci_bus_ids = ['0000:01:00.0', '0000:01:00.0', '0000:02:00.0', '0000:03:00.0']",
         "gpus[1].pci_bus_id: 00000000:01:00.0 is also GPU 0's"),
        ("pci_bus_ids = ['0000:01:00.0']", "pci_bus_ids: expected 4 bus ids, one per GPU, got 1"),
        ("pci_bus_ids = ['bus']", "pci_bus_ids[0]: expected a PCI bus id like 0000:1a:00.0, got 'bus'"),
        ("[gpus.0]\nmig = [{profile = '1g.5gb', memory_mib = 600, count = 2}]",
         "gpus[0].mig: MIG instances need more than the GPU's 1000 MiB"),
        ("[gpus.0]\nmig = [{profile = '1g.5gb'}]", "gpus[0].mig[0].memory_mib: missing"),
        ("[gpus.0]\nmig_capable = false\nmig = [{profile = '1g', memory_mib = 10}]",
         "gpus[0].mig_capable: MIG instances are listed but mig_capable is false"),
        ("[[nvswitch]]\ngpus = '0-3'", "nvswitch[0].links_per_switch: missing"),
        ("[[nvswitch]]\nlinks_per_switch = [1]", "nvswitch[0].gpus: missing"),
        ("[[nvswitch]]\ngpus = '0-1'\nlinks_per_switch = [2, 2]\n[nvswitch.overrides]\n3 = [1, 1]",
         "nvswitch[0].overrides.3: GPU 3 is not in this switch fabric's gpus"),
        ("[[nvswitch]]\ngpus = '0-1'\nlinks_per_switch = [2, 2]\n[nvswitch.overrides]\n1 = [1]",
         "nvswitch[0].overrides.1: expected 2 link counts"),
        ("cuda_driver_version = 'twelve'", 'cuda_driver_version: expected "MAJOR.MINOR" like "12.4"'),
        ("cuda_driver_version = 12",
         "cuda_driver_version: expected \"MAJOR.MINOR\" like \"12.4\" or NVML's 12040, got 12"),
        ("[gpus.1]\ncompute_capability = [9]",
         'gpus[1].compute_capability: expected "MAJOR.MINOR" like "9.0", got [9]'),
        ("[gpus.1]\nmig_capable = 1", "gpus[1].mig_capable: expected true or false, got 1"),
        ("[simulate]\nworker_utilization_pct = 101", "simulate.worker_utilization_pct: expected an integer <= 100"),
        ("[simulate]\nworker_memory = 1", "simulate.worker_memory: unknown field"),
    ],
)
def test_mistakes_name_file_and_field(extra: str, message: str) -> None:
    with pytest.raises(MachineFileError) as err:
        text = MINIMAL + extra if extra.startswith("[") else extra + MINIMAL
        parse_machine_file(text + "\n", "mybox.toml")
    assert str(err.value).startswith("mybox.toml: ")
    assert message in str(err.value)


def test_missing_required_fields() -> None:
    with pytest.raises(MachineFileError, match=r"^m.toml: gpu_count: missing \(expected the number of GPUs"):
        parse_machine_file("[gpu_defaults]\nname = 'x'\n", "m.toml")
    with pytest.raises(MachineFileError, match=r"gpus\[0\]\.memory_mib: missing"):
        parse_machine_file("gpu_count = 1\n[gpu_defaults]\nname = 'x'\n", "m.toml")


def test_what_belongs_to_one_gpu_is_not_a_default() -> None:
    with pytest.raises(MachineFileError, match=r"^m.toml: gpu_defaults.pci_bus_id: unknown field \(known: compute"):
        parse_machine_file("gpu_count = 1\n[gpu_defaults]\npci_bus_id = '0000:01:00.0'\n", "m.toml")


def test_gpu_count_is_bounded() -> None:
    expected = r"^m.toml: gpu_count: expected the number of GPUs, 0 \(none\) to 1024, got 2000$"
    with pytest.raises(MachineFileError, match=expected):
        parse_machine_file("gpu_count = 2000\n", "m.toml")


def test_not_toml(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("gpu_count = = 2\n")
    with pytest.raises(MachineFileError, match=r"broken.toml: not valid TOML"):
        load_machine_spec(str(path))


def test_pcie_rules_and_precedence() -> None:
    spec = parse_machine_file(MINIMAL + """
[[numa]]
gpus = "0-1"
[[numa]]
gpus = "2"
[pcie]
same_numa = "PHB"
groups = { PXB = ["0-2"], PIX = ["0-1"] }
[pcie.pairs]
1-2 = "NODE"
""", "m.toml")
    assert spec.pcie_level(0, 1) is PcieLevel.SINGLE      # closest group wins
    assert spec.pcie_level(0, 2) is PcieLevel.MULTIPLE    # group over the NUMA rule
    assert spec.pcie_level(2, 1) is PcieLevel.NODE        # an explicit pair over everything
    assert spec.pcie_level(0, 3) is PcieLevel.SYSTEM      # GPU 3 has no node: cross
    assert spec.gpus[3].numa_node is None


def test_nvlink_ports_are_reported_port_by_port() -> None:
    spec = parse_machine_file(MINIMAL + """
[[nvswitch]]
gpus = "0-1"
links_per_switch = [2, 1]
pci_bus_ids = ["0000:e0:00.0", "0000:e1:00.0"]
[[nvlink.mesh]]
gpus = "0-2"
links = 2
[nvlink.pairs]
0-2 = 1
""", "m.toml")
    g0 = spec.gpus[0]
    remotes = [(p.remote_bus_id, p.remote_is_switch) for p in g0.ports if p is not None]
    assert remotes == [
        ("00000000:E0:00.0", True), ("00000000:E0:00.0", True), ("00000000:E1:00.0", True),
        (spec.gpus[1].pci_bus_id, False), (spec.gpus[1].pci_bus_id, False),
        (spec.gpus[2].pci_bus_id, False),
    ]
    assert spec.switch_bus_ids == ("00000000:E0:00.0", "00000000:E1:00.0")
    assert spec.gpus[3].ports == ()


def test_mig_instances_expand() -> None:
    spec = load_machine_spec("dgx-a100-mig")
    assert [(m.profile, m.memory_mib, m.gpu_instance_id, m.slices) for m in spec.gpus[6].mig] == [
        ("3g.20gb", 19968, 2, 3), ("2g.10gb", 9856, 3, 2), ("2g.10gb", 9856, 5, 2)]
    assert [m.gpu_instance_id for m in spec.gpus[7].mig] == list(range(7, 14))
    assert all(g.mig_capable and not g.mig for g in spec.gpus[:6])


@pytest.mark.parametrize(("text", "indices"), [
    ("0", (0,)), ("0-3", (0, 1, 2, 3)), ("0-1,5,7-8", (0, 1, 5, 7, 8)), ("3,1,2", (1, 2, 3)),
])
def test_ranges_round_trip(text: str, indices: tuple[int, ...]) -> None:
    assert parse_ranges(text) == indices
    assert parse_ranges(format_ranges(indices)) == indices


def test_format_ranges() -> None:
    assert format_ranges(list(range(56)) + list(range(112, 168))) == "0-55,112-167"
    assert format_ranges([]) == ""


@pytest.mark.parametrize("bad", ["", "a", "3-1", "1,,2", "-1"])
def test_bad_ranges(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_ranges(bad)
