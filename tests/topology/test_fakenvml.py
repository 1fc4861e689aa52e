"""The fake behaves like pynvml where discovery and telemetry can tell."""

from __future__ import annotations

import pynvml
import pytest

from computegroups.topology.fakenvml import FakeNvml
from computegroups.topology.machinefile import MachineFileError, parse_machine_file


@pytest.fixture
def nv() -> FakeNvml:
    fake = FakeNvml("dgx-h100")
    fake.nvmlInit()
    return fake


def test_raises_pynvml_error_classes(nv: FakeNvml) -> None:
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetHandleByIndex(8)
    v100 = FakeNvml("dgx1-v100")
    v100.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotSupported) as err:
        v100.nvmlDeviceGetRemappedRows(v100.nvmlDeviceGetHandleByIndex(0))
    assert isinstance(err.value, pynvml.NVMLError) and str(err.value) == "Not Supported"
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        nv.nvmlDeviceGetBrand(nv.nvmlDeviceGetHandleByIndex(0))


def test_calls_before_init_are_uninitialized() -> None:
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        FakeNvml("dgx-h100").nvmlDeviceGetCount()


def test_return_shapes_match_pynvml(nv: FakeNvml) -> None:
    h = nv.nvmlDeviceGetHandleByIndex(2)
    memory = nv.nvmlDeviceGetMemoryInfo(h)
    assert isinstance(memory, pynvml.c_nvmlMemory_t)
    assert memory.total == 81559 * 1024 * 1024 and memory.free + memory.used == memory.total
    pci = nv.nvmlDeviceGetPciInfo(h)
    assert isinstance(pci, pynvml.nvmlPciInfo_t)
    assert pci.busId == "00000000:3A:00.0" and pci.bus == 0x3A
    assert nv.nvmlDeviceGetCudaComputeCapability(h) == (9, 0)
    assert nv.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
    assert nv.nvmlDeviceGetUUID(h).startswith("GPU-")
    affinity = nv.nvmlDeviceGetCpuAffinity(h, 4)
    # CPUs 0-55 and 112-167, 64 per word
    assert list(affinity) == [(1 << 56) - 1, ((1 << 16) - 1) << 48, (1 << 40) - 1, 0]
    assert nv.nvmlDeviceGetTopologyCommonAncestor(h, nv.nvmlDeviceGetHandleByIndex(6)) == \
        pynvml.NVML_TOPOLOGY_SYSTEM
    assert nv.nvmlDeviceGetMigMode(h) == [pynvml.NVML_DEVICE_MIG_DISABLE] * 2
    assert nv.nvmlSystemGetCudaDriverVersion() == 12040
    assert nv.NVML_NVLINK_MAX_LINKS == pynvml.NVML_NVLINK_MAX_LINKS  # constants are pynvml's


def test_nvlink_ports_on_the_switch_fabric(nv: FakeNvml) -> None:
    h = nv.nvmlDeviceGetHandleByIndex(0)
    remotes = []
    for link in range(18):
        assert nv.nvmlDeviceGetNvLinkState(h, link) == pynvml.NVML_FEATURE_ENABLED
        assert nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, link) == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        remotes.append(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
    assert [remotes.count(b) for b in sorted(set(remotes))] == [5, 5, 4, 4]
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetNvLinkState(h, 18)


def test_nvlink_ports_between_gpus_and_idle_ports() -> None:
    nv = FakeNvml("dgx1-v100")
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    buses = [nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId for link in range(6)]
    peers = [nv.nvmlDeviceGetPciInfo(nv.nvmlDeviceGetHandleByIndex(i)).busId for i in (1, 2, 3, 4)]
    assert sorted(buses) == sorted([peers[0], peers[1], peers[2], peers[2], peers[3], peers[3]])
    assert nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, 0) == pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
    bare = FakeNvml("workstation-4x-pcie")
    bare.nvmlInit()
    idle = bare.nvmlDeviceGetHandleByIndex(0)
    assert bare.nvmlDeviceGetNvLinkState(idle, 3) == pynvml.NVML_FEATURE_DISABLED


def test_mig_handles() -> None:
    nv = FakeNvml("dgx-a100-mig")
    nv.nvmlInit()
    parent = nv.nvmlDeviceGetHandleByIndex(6)
    assert nv.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    assert nv.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
    assert nv.nvmlDeviceGetMemoryInfo(mig).total == 19968 * 1024 * 1024
    assert (nv.nvmlDeviceGetGpuInstanceId(mig), nv.nvmlDeviceGetComputeInstanceId(mig)) == (2, 0)
    assert nv.nvmlDeviceGetAttributes(mig).multiprocessorCount == 42
    assert nv.nvmlDeviceIsMigDeviceHandle(mig)
    assert nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig) == parent
    assert nv.nvmlDeviceGetHandleByUUID(nv.nvmlDeviceGetUUID(mig)) == mig
    with pytest.raises(pynvml.NVMLError_NotFound):
        nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, 3)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nv.nvmlDeviceGetNvLinkState(mig, 0)


def test_hooks_must_name_real_functions() -> None:
    with pytest.raises(ValueError, match="nvmlDeviceGetNumaNode is not an NVML function"):
        FakeNvml("dgx-h100", unsupported={"nvmlDeviceGetNumaNode": None})
    spec = parse_machine_file('gpu_count = 1\n[gpu_defaults]\nname = "x"\nmemory_mib = 1\n'
                              'unsupported = ["nvmlGetEverything"]\n', "box.toml")
    with pytest.raises(MachineFileError, match=r"^box.toml: gpus\[0\].unsupported: nvmlGetEverything"):
        FakeNvml(spec)
