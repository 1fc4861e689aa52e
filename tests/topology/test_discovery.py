"""Discovery on every simulated machine, and when NVML or a GPU lets it down.

The fake answers like pynvml (its error classes included), so these tests
run the same discovery code a real box runs.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from computegroups.topology import load_machine, simulated_gateway
from computegroups.topology.discovery import discover
from computegroups.topology.fakenvml import FakeHandle, FakeNvml
from computegroups.topology.model import DomainKind, Machine, PcieLevel
from computegroups.topology.nvml import (
    NVMLError_DriverNotLoaded,
    NVMLError_LibraryNotFound,
    NVMLError_Uninitialized,
    NVMLError_Unknown,
    NvmlGateway,
    NvmlUnavailable,
)
from computegroups.topology.ranges import parse_ranges

PIX, PXB, PHB, NODE, SYS = (PcieLevel.SINGLE, PcieLevel.MULTIPLE, PcieLevel.HOSTBRIDGE,
                            PcieLevel.NODE, PcieLevel.SYSTEM)

DGX1_NV1 = {(0, 1), (0, 2), (1, 3), (2, 6), (3, 7), (4, 5), (4, 6), (5, 7)}
DGX1_NV2 = {(0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (4, 7), (5, 6), (6, 7)}


def run(fake: FakeNvml) -> Machine:
    with simulated_gateway(fake) as gateway:
        return discover(gateway)


def pairs(n: int) -> list[tuple[int, int]]:
    return list(itertools.combinations(range(n), 2))


def test_dgx_h100() -> None:
    m = load_machine("dgx-h100")
    assert m.source == "simulated:dgx-h100"
    assert m.hostname == "dgx-h100-sim"
    assert (m.driver_version, m.cuda_driver_version) == ("550.54.15", "12.4")
    assert len(m.gpus) == 8 and not m.lost_gpus
    assert {g.name for g in m.gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {g.memory_mib for g in m.gpus} == {81559}
    assert {g.compute_capability for g in m.gpus} == {(9, 0)}
    assert {g.multiprocessors for g in m.gpus} == {132}
    assert all(g.nvswitch_links == 18 and g.mig_enabled is False for g in m.gpus)
    for a, b in pairs(8):
        assert m.nvlinks(a, b) == 18
        assert m.link(a, b).pcie is (NODE if (a < 4) == (b < 4) else SYS)
    assert m.has_nvswitch
    assert m.nvlink_islands == (frozenset(range(8)),)
    assert m.numa_nodes == (0, 1)
    assert m.gpus_by_numa == {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}
    assert m.gpu(0).cpu_affinity == parse_ranges("0-55,112-167")
    assert m.gpu(7).cpu_affinity == parse_ranges("56-111,168-223")
    assert m.gpu(0).pci_bus_id == "00000000:18:00.0"
    assert len(set(m.fingerprint)) == 8 and all(u.startswith("GPU-") for u in m.fingerprint)


def test_dgx1_v100_every_pair() -> None:
    m = load_machine("dgx1-v100")
    assert not m.has_nvswitch
    for a, b in pairs(8):
        expected = 1 if (a, b) in DGX1_NV1 else 2 if (a, b) in DGX1_NV2 else 0
        assert m.nvlinks(a, b) == expected, (a, b)
        if a // 4 != b // 4:
            pcie = SYS
        elif a // 2 == b // 2:
            pcie = PIX
        else:
            pcie = PHB
        assert m.link(a, b).pcie is pcie, (a, b)
        assert m.link(a, b).label == (f"NV{expected}" if expected else pcie.label)
    assert m.nvlink_islands == (frozenset(range(8)),)
    assert m.pcie_switches == tuple(frozenset({i, i + 1}) for i in range(0, 8, 2))
    assert all(g.multiprocessors is None for g in m.gpus)  # Volta: no device attributes
    assert all(g.mig_enabled is False for g in m.gpus)     # MigMode NotSupported = no MIG


def test_workstations() -> None:
    plain = load_machine("workstation-4x-pcie")
    bridged = load_machine("workstation-nvlink-pairs")
    for m in (plain, bridged):
        assert [g.memory_mib for g in m.gpus] == [49140] * 4
        assert m.gpus_by_numa == {0: (0, 1), 1: (2, 3)}
        for a, b in pairs(4):
            assert m.link(a, b).pcie is (NODE if a // 2 == b // 2 else SYS)
    assert all(plain.nvlinks(a, b) == 0 for a, b in pairs(4))
    assert plain.nvlink_islands == tuple(frozenset({i}) for i in range(4))
    assert {p: bridged.nvlinks(*p) for p in pairs(4) if bridged.nvlinks(*p)} == {(0, 1): 4, (2, 3): 4}
    assert bridged.nvlink_islands == (frozenset({0, 1}), frozenset({2, 3}))
    assert not bridged.has_nvswitch


def test_dgx_a100_mig() -> None:
    m = load_machine("dgx-a100-mig")
    assert all(m.nvlinks(a, b) == 12 for a, b in pairs(8))
    assert [g.mig_enabled for g in m.gpus] == [False] * 6 + [True, True]
    six, seven = m.gpu(6).mig_devices, m.gpu(7).mig_devices
    assert [(d.profile, d.memory_mib, d.gpu_instance_id, d.slices) for d in six] == [
        ("3g.20gb", 19968, 2, 3), ("2g.10gb", 9856, 3, 2), ("2g.10gb", 9856, 5, 2)]
    assert [(d.profile, d.memory_mib) for d in seven] == [("1g.5gb", 4864)] * 7
    assert [d.gpu_instance_id for d in seven] == list(range(7, 14))
    assert all(d.parent_index == 7 and d.compute_instance_id == 0 for d in seven)
    assert [d.index for d in seven] == list(range(7))
    assert len({d.uuid for d in six + seven}) == 10
    assert all(d.uuid.startswith("MIG-") for d in six + seven)
    assert m.mig_device(six[0].uuid) == six[0]
    assert m.gpu(6).memory_mib == 40960


def test_cpu_only_is_a_machine_without_gpus() -> None:
    m = load_machine("cpu-only")
    assert m.gpus == () and m.links == () and m.lost_gpus == ()
    assert m.nvlink_islands == () and m.domains(DomainKind.MACHINE) == ()


def test_synthetic_72() -> None:
    m = load_machine("synthetic-72")
    assert len(m.gpus) == 72
    islands = [sorted(i) for i in m.nvlink_islands]
    assert len(islands) == 20
    assert islands[:3] == [list(range(8)), list(range(8, 16)), [16, 17]]
    assert [16, 17] in islands and [32, 33, 34, 35] in islands and [64] in islands
    assert all(m.nvlinks(a, b) == 12 for a, b in itertools.combinations(range(8), 2))
    assert all(m.nvlinks(a, b) == 18 for a, b in itertools.combinations(range(24, 32), 2))
    assert m.nvlinks(48, 55) == 10 and m.nvlinks(48, 54) == 12
    assert m.nvlinks(40, 43) == 1 and m.nvlinks(8, 11) == 2
    assert m.nvlinks(56, 63) == 2 and m.nvlinks(56, 58) == 0
    assert m.nvlinks(32, 35) == 4 and m.nvlinks(32, 36) == 0
    assert m.nvlinks(0, 24) == 0  # separate switch fabrics do not connect
    assert m.gpu(55).nvswitch_links == 10
    assert {len(v) for v in m.gpus_by_numa.values()} == {16, 24}
    assert sorted(m.gpus_by_numa) == [0, 1, 2, 3]
    assert {len(s) for s in m.pcie_switches} <= {1, 2, 3, 4}
    assert m.link(32, 34).pcie is PXB and m.link(32, 33).pcie is PIX
    assert m.link(0, 15).pcie is NODE and m.link(0, 16).pcie is SYS
    assert [d.profile for d in m.gpu(31).mig_devices] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert {m.gpu(i).name for i in range(64, 72)} == {"NVIDIA L40S"}
    assert load_machine("synthetic-72") == m


def test_cg_simulate_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CG_SIMULATE", "workstation-4x-pcie")
    assert load_machine().source == "simulated:workstation-4x-pcie"
    assert load_machine("dgx-h100").source == "simulated:dgx-h100"  # explicit wins
    own = tmp_path / "mine.toml"
    own.write_text('gpu_count = 1\n[gpu_defaults]\nname = "x"\nmemory_mib = 10\n')
    monkeypatch.setenv("CG_SIMULATE", str(own))
    assert load_machine().source == "simulated:mine"


# -- NVML absent ----------------------------------------------------------------

@pytest.mark.parametrize("error", [NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded])
def test_nvml_absent_raises_a_hint(error: type) -> None:
    with pytest.raises(NvmlUnavailable) as err:
        run(FakeNvml("dgx-h100", init_error=error))
    message = str(err.value)
    assert "--simulate NAME" in message
    assert "dgx1-v100" in message and "synthetic-72" in message


def test_real_nvml_absent_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CG_SIMULATE", raising=False)
    try:
        machine = load_machine()
    except NvmlUnavailable as err:
        assert "--simulate" in str(err)
    else:
        assert machine.source == "nvml"  # a box with a driver: the real path ran


def test_closed_gateway_refuses() -> None:
    gateway = simulated_gateway(FakeNvml("dgx-h100"))
    gateway.close()
    with pytest.raises(NvmlUnavailable):
        discover(gateway)


def test_gateway_starts_lazily_and_shuts_down() -> None:
    fake = FakeNvml("dgx-h100")
    gateway = NvmlGateway(fake, hostname="h", sysfs_root=None)
    with pytest.raises(NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    assert gateway.query("nvmlDeviceGetCount") == 8
    handle = gateway.call("nvmlDeviceGetHandleByIndex", 0)
    assert gateway.query("nvmlDeviceGetNumaNodeId", "not a handle", default="x") == "x"
    assert gateway.query("nvmlDeviceGetBrand", handle, default="n/a") == "n/a"  # not simulated
    assert gateway.query("nvmlNoSuchFunction", default="n/a") == "n/a"
    gateway.close()
    with pytest.raises(NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    with pytest.raises(NvmlUnavailable):
        gateway.call("nvmlDeviceGetCount")


# -- one GPU or one field failing --------------------------------------------------

def test_nvlink_not_supported_on_some_gpus() -> None:
    m = run(FakeNvml("dgx-h100", unsupported={"nvmlDeviceGetNvLinkState": {3}}))
    assert len(m.gpus) == 8
    assert all(m.nvlinks(3, b) == 0 for b in range(8) if b != 3)
    assert m.nvlinks(0, 1) == 18 and m.gpu(3).nvswitch_links == 0
    assert m.nvlink_islands == (frozenset({0, 1, 2, 4, 5, 6, 7}), frozenset({3}))
    v100 = run(FakeNvml("dgx1-v100", unsupported={"nvmlDeviceGetNvLinkState": {0}}))
    assert v100.nvlinks(0, 3) == 2  # counted from GPU 3's side
    assert v100.nvlinks(1, 2) == 2


@pytest.mark.parametrize("machine", ["dgx-h100", "dgx1-v100", "dgx-a100-mig", "synthetic-72"])
def test_older_driver_without_remote_device_type(machine: str) -> None:
    old = run(FakeNvml(machine, missing={"nvmlDeviceGetNvLinkRemoteDeviceType"}))
    assert old.links == load_machine(machine).links
    assert old.has_nvswitch == load_machine(machine).has_nvswitch


def test_remote_bus_unknown_counts_as_switch() -> None:
    m = run(FakeNvml("dgx-h100", missing={"nvmlDeviceGetNvLinkRemoteDeviceType",
                                          "nvmlDeviceGetNvLinkRemotePciInfo"}))
    assert all(m.nvlinks(a, b) == 18 for a, b in pairs(8))


def test_numa_falls_back_to_affinity_then_sysfs(tmp_path: Path) -> None:
    m = run(FakeNvml("dgx-h100", unsupported={"nvmlDeviceGetNumaNodeId": None}))
    assert m.gpus_by_numa == {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}

    neither = {"nvmlDeviceGetNumaNodeId": {5}, "nvmlDeviceGetMemoryAffinity": {5}}
    m = run(FakeNvml("dgx-h100", unsupported=neither))
    assert m.gpu(5).numa_node is None and m.gpu(4).numa_node == 1
    assert m.numa_nodes == (0, 1)

    device = tmp_path / "bus" / "pci" / "devices" / "0000:ab:00.0"
    device.mkdir(parents=True)
    (device / "numa_node").write_text("1\n")
    gateway = NvmlGateway(FakeNvml("dgx-h100", unsupported=neither), sysfs_root=tmp_path)
    with gateway:
        assert discover(gateway).gpu(5).numa_node == 1


def test_unsupported_fields_degrade_to_none() -> None:
    hooks = {"nvmlDeviceGetCudaComputeCapability": {1}, "nvmlDeviceGetMemoryInfo": {1},
             "nvmlDeviceGetCpuAffinity": {1}, "nvmlDeviceGetName": {1},
             "nvmlDeviceGetMigMode": {1}, "nvmlSystemGetDriverVersion": None}
    m = run(FakeNvml("dgx-h100", missing={"nvmlSystemGetDriverVersion"}, unsupported=hooks))
    g = m.gpu(1)
    assert (g.compute_capability, g.memory_mib, g.cpu_affinity, g.name) == (None, None, None, "unknown")
    assert g.mig_enabled is False  # NotSupported on MigMode means "no MIG"
    assert m.driver_version is None and m.cuda_driver_version == "12.4"
    assert m.gpu(0).memory_mib == 81559


def test_mig_profile_without_device_names() -> None:
    m = run(FakeNvml("dgx-a100-mig", unsupported={"nvmlDeviceGetName": {6, 7}}))
    assert [d.profile for d in m.gpu(6).mig_devices] == ["3g.20gb", "2g.10gb", "2g.10gb"]
    assert {d.profile for d in m.gpu(7).mig_devices} == {"1g.5gb"}


def test_gpu_lost_mid_discovery() -> None:
    m = run(FakeNvml("dgx-h100", lose_gpu_at={3: "nvmlDeviceGetNvLinkState"}))
    assert [g.index for g in m.gpus] == [0, 1, 2, 4, 5, 6, 7]
    assert len(m.lost_gpus) == 1
    lost = m.lost_gpus[0]
    assert lost.index == 3 and lost.reason == "GPU is lost" and lost.uuid is not None
    assert all(3 not in (link.a, link.b) for link in m.links)
    assert m.nvlinks(2, 4) == 18


def test_gpu_lost_while_pairs_are_read() -> None:
    m = run(FakeNvml("dgx1-v100", lose_gpu_at={2: "nvmlDeviceGetTopologyCommonAncestor"}))
    assert [g.index for g in m.lost_gpus] == [2]
    assert 2 not in m.indices
    assert m.link(0, 1).pcie is PIX and m.nvlinks(0, 1) == 1


def test_gpu_lost_per_fault_file(tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    faults.write_text('{"lost": [5]}')
    m = run(FakeNvml("dgx-h100", faults_file=faults))
    assert [g.index for g in m.lost_gpus] == [5] and m.lost_gpus[0].uuid is None


def test_unknown_error_on_a_handle_is_a_lost_gpu() -> None:
    class Flaky(FakeNvml):
        def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
            if index == 2:
                raise NVMLError_Unknown()
            return super().nvmlDeviceGetHandleByIndex(index)

    m = run(Flaky("workstation-nvlink-pairs"))
    assert [(g.index, g.reason) for g in m.lost_gpus] == [(2, "Unknown Error")]
    assert m.nvlink_islands == (frozenset({0, 1}), frozenset({3}))
