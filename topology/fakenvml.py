"""A stand-in for the `pynvml` module, answering from a machine file.

Discovery and telemetry must run the very code they run on a real box, so
this fake is module-shaped: the same function names and arguments, the same
return shapes (pynvml's own ctypes structures where pynvml returns them) and
pynvml's own `NVMLError_*` classes. NVLinks are reported the way hardware
reports them, port by port with the remote's PCI bus id and device type,
NVSwitches included, so discovery's reconstruction of the link graph is really
exercised. Constants and structures not defined here are pynvml's; an `nvml*`
function not simulated raises `NVMLError_FunctionNotFound`, as a driver
lacking it would.

Tests can make chosen calls unsupported, remove functions (an older driver),
lose a GPU at a chosen call or fail `nvmlInit`; faults for the health loop
come from the `CG_SIM_FAULTS` file (see `computegroups.topology.simfaults`).
Given a `worker_mark`, the GPUs also list the marked processes that use
them (`computegroups.topology.simworkers`) with the memory and utilization
of the machine file's `[simulate]` or the fault file.
"""

from __future__ import annotations

import ctypes
import inspect
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from computegroups.topology import nvml
from computegroups.topology.machinefile import load_machine_spec
from computegroups.topology.machinespec import GpuSpec, MachineFileError, MachineSpec
from computegroups.topology.simfaults import Faults, FaultSource
from computegroups.topology.simworkers import MarkedProcesses

_nv = nvml.real_binding()
_MIB = 1024 * 1024
_NO_INSTANCE = 0xFFFFFFFF
_MIG_CALLS = frozenset({
    "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetAttributes",
    "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId", "nvmlDeviceIsMigDeviceHandle",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses",
})


@dataclass(frozen=True)
class FakeHandle:
    """An opaque device handle; equal handles name the same device, like NVML's."""

    gpu: int
    mig: int | None = None


@dataclass
class FakeEventSet:
    registered: dict[int, int] = field(default_factory=dict)
    freed: bool = False


def _raise(error: type[nvml.NVMLError]) -> NoReturn:
    raise error()


def _words(bits: Iterable[int], size: int) -> Any:
    """A ctypes array of 64-bit masks, as pynvml returns affinities."""
    array = (ctypes.c_ulonglong * size)()
    for bit in bits:
        if bit < size * 64:
            array[bit // 64] |= 1 << (bit % 64)
    return array


def _pci_info(bus_id: str) -> Any:
    domain, bus, rest = bus_id.split(":")
    device = rest.split(".")[0]
    legacy = f"{int(domain, 16):04X}:{bus}:{rest}"
    return _nv.nvmlPciInfo_t(
        busIdLegacy=legacy.encode(), domain=int(domain, 16), bus=int(bus, 16),
        device=int(device, 16), pciDeviceId=0x10DE, pciSubSystemId=0, busId=bus_id.encode(),
    )


class FakeNvml:
    """One simulated machine behind pynvml's API."""

    def __init__(
        self,
        machine: MachineSpec | str,
        *,
        unsupported: Mapping[str, Collection[int] | None] | None = None,
        missing: Collection[str] = (),
        lose_gpu_at: Mapping[int, str] | None = None,
        init_error: type[nvml.NVMLError] | None = None,
        faults_file: str | Path | None = None,
        worker_mark: tuple[str, str] | None = None,
    ) -> None:
        self.spec = machine if isinstance(machine, MachineSpec) else load_machine_spec(machine)
        self.simulated_name = self.spec.name
        self.hostname = self.spec.hostname
        self._unsupported = dict(unsupported or {})
        self._missing = frozenset(missing)
        self._lose_at = dict(lose_gpu_at or {})
        self._init_error = init_error
        self._faults = FaultSource(faults_file)
        self._lost: set[int] = set()
        self._delivered: set[tuple[int, int, int]] = set()
        self._init_count = 0
        self._check_names()
        self._marked: MarkedProcesses | None = None
        if worker_mark is not None:
            uuids = {g.uuid: g.index for g in self.spec.gpus}
            uuids.update({m.uuid: g.index for g in self.spec.gpus for m in g.mig})
            self._marked = MarkedProcesses(worker_mark, uuids, len(self.spec.gpus))

    def _check_names(self) -> None:
        for gpu in self.spec.gpus:
            for name in gpu.unsupported:
                if not inspect.isfunction(getattr(_nv, name, None)):
                    raise MachineFileError(
                        f"{self.spec.label}: gpus[{gpu.index}].unsupported: {name} is not an NVML function"
                    )
        for name in (*self._unsupported, *self._missing, *self._lose_at.values()):
            if not inspect.isfunction(getattr(_nv, name, None)):
                raise ValueError(f"{name} is not an NVML function")

    def __getattr__(self, name: str) -> Any:
        attr = getattr(_nv, name)
        if name.startswith("nvml") and inspect.isfunction(attr):
            def not_simulated(*args: Any, **kwargs: Any) -> NoReturn:
                raise nvml.NVMLError_FunctionNotFound()
            return not_simulated
        return attr

    # -- the checks every call goes through -------------------------------
    def _enter(self, fn: str) -> None:
        if fn in self._missing:
            _raise(nvml.NVMLError_FunctionNotFound)
        if self._init_count == 0:
            _raise(nvml.NVMLError_Uninitialized)

    def _gpu(self, handle: Any, fn: str) -> GpuSpec:
        self._enter(fn)
        if not isinstance(handle, FakeHandle) or not 0 <= handle.gpu < len(self.spec.gpus):
            _raise(nvml.NVMLError_InvalidArgument)
        index = handle.gpu
        if index in self._lost or index in self._faults.current().lost:
            _raise(nvml.NVMLError_GpuIsLost)
        if self._lose_at.get(index) == fn:
            self._lost.add(index)
            _raise(nvml.NVMLError_GpuIsLost)
        gpu = self.spec.gpus[index]
        if fn in self._unsupported:
            which = self._unsupported[fn]
            if which is None or index in which:
                _raise(nvml.NVMLError_NotSupported)
        if fn in gpu.unsupported:
            _raise(nvml.NVMLError_NotSupported)
        if handle.mig is not None and fn not in _MIG_CALLS:
            _raise(nvml.NVMLError_NotSupported)
        return gpu

    def _port(self, handle: Any, link: int, fn: str) -> Any:
        gpu = self._gpu(handle, fn)
        if not gpu.ports:
            _raise(nvml.NVMLError_NotSupported)
        if not 0 <= link < min(len(gpu.ports), _nv.NVML_NVLINK_MAX_LINKS):
            _raise(nvml.NVMLError_InvalidArgument)
        return gpu.ports[link]

    def _workers(self, gpu: int, faults: Faults) -> tuple[tuple[int, int], ...]:
        """(pid, MiB) of the marked processes on this GPU, when asked for: none by default,
        so a simulated machine without `[simulate]` shows only the fault file's processes."""
        if self._marked is None:
            return ()
        mib = faults.worker_memory_mib.get(gpu, self.spec.worker_memory_mib)
        if mib is None and gpu not in faults.worker_utilization_pct and self.spec.worker_utilization_pct is None:
            return ()
        return tuple((pid, mib or 0) for pid in self._marked.by_gpu().get(gpu, ()))

    def _compute_processes(self, gpu: int) -> tuple[tuple[int, int], ...]:
        faults = self._faults.current()
        return faults.processes.get(gpu, ()) + self._workers(gpu, faults)

    # -- library and system -----------------------------------------------
    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags: int) -> None:
        if self._init_error is not None:
            _raise(self._init_error)
        self._init_count += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        if self.spec.driver_version is None:
            _raise(nvml.NVMLError_NotSupported)
        return self.spec.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        if self.spec.cuda_driver_version is None:
            _raise(nvml.NVMLError_NotSupported)
        return self.spec.cuda_driver_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion_v2")
        return self.nvmlSystemGetCudaDriverVersion()

    # -- device identity --------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.spec.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        handle = FakeHandle(index)
        self._gpu(handle, "nvmlDeviceGetHandleByIndex")
        return handle

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByUUID")
        for gpu in self.spec.gpus:
            if gpu.uuid == uuid:
                return self.nvmlDeviceGetHandleByIndex(gpu.index)
            for k, mig in enumerate(gpu.mig):
                if mig.uuid == uuid:
                    return FakeHandle(gpu.index, k)
        _raise(nvml.NVMLError_NotFound)

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByPciBusId")
        for gpu in self.spec.gpus:
            if gpu.pci_bus_id.lower().endswith(bus_id.lower()[-12:]):
                return self.nvmlDeviceGetHandleByIndex(gpu.index)
        _raise(nvml.NVMLError_NotFound)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._gpu(handle, "nvmlDeviceGetIndex").index

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        gpu = self._gpu(handle, "nvmlDeviceGetUUID")
        return gpu.uuid if handle.mig is None else gpu.mig[handle.mig].uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        gpu = self._gpu(handle, "nvmlDeviceGetName")
        return gpu.name if handle.mig is None else f"{gpu.name} MIG {gpu.mig[handle.mig].profile}"

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        return _pci_info(self._gpu(handle, "nvmlDeviceGetPciInfo").pci_bus_id)

    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> Any:
        return _pci_info(self._gpu(handle, "nvmlDeviceGetPciInfo_v3").pci_bus_id)

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        gpu = self._gpu(handle, "nvmlDeviceGetCudaComputeCapability")
        if gpu.compute_capability is None:
            _raise(nvml.NVMLError_NotSupported)
        return gpu.compute_capability

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        if handle.mig is not None:
            total, used = gpu.mig[handle.mig].memory_mib * _MIB, 0
        else:
            total = gpu.memory_mib * _MIB
            used = sum(mib for _, mib in self._compute_processes(gpu.index)) * _MIB
            used = min(used, total)
        if version:
            return _nv.c_nvmlMemory_v2_t(version=version, total=total, reserved=0,
                                         free=total - used, used=used)
        return _nv.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetAttributes(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetAttributes")
        if handle.mig is None:
            if gpu.multiprocessors is None:
                _raise(nvml.NVMLError_NotSupported)
            return _nv.c_nvmlDeviceAttributes(multiprocessorCount=gpu.multiprocessors,
                                              memorySizeMB=gpu.memory_mib)
        mig = gpu.mig[handle.mig]
        return _nv.c_nvmlDeviceAttributes(
            multiprocessorCount=mig.multiprocessors or 0,
            gpuInstanceSliceCount=mig.slices or 0, computeInstanceSliceCount=mig.slices or 0,
            memorySizeMB=mig.memory_mib,
        )

    def nvmlDeviceGetAttributes_v2(self, handle: Any) -> Any:
        self._enter("nvmlDeviceGetAttributes_v2")
        return self.nvmlDeviceGetAttributes(handle)

    # -- NUMA and CPUs ----------------------------------------------------
    def nvmlDeviceGetNumaNodeId(self, handle: Any) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetNumaNodeId")
        if gpu.numa_node is None:
            _raise(nvml.NVMLError_NotSupported)
        return gpu.numa_node

    def nvmlDeviceGetMemoryAffinity(self, handle: Any, nodeSetSize: int, scope: int) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryAffinity")
        if gpu.numa_node is None:
            _raise(nvml.NVMLError_NotSupported)
        return _words([gpu.numa_node], nodeSetSize)

    def nvmlDeviceGetCpuAffinity(self, handle: Any, cpuSetSize: int) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetCpuAffinity")
        if gpu.cpu_affinity is None:
            _raise(nvml.NVMLError_NotSupported)
        return _words(gpu.cpu_affinity, cpuSetSize)

    def nvmlDeviceGetCpuAffinityWithinScope(self, handle: Any, cpuSetSize: int, scope: int) -> Any:
        self._enter("nvmlDeviceGetCpuAffinityWithinScope")
        return self.nvmlDeviceGetCpuAffinity(handle, cpuSetSize)

    # -- MIG --------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu = self._gpu(handle, "nvmlDeviceGetMigMode")
        if not gpu.mig_capable:
            _raise(nvml.NVMLError_NotSupported)
        mode = _nv.NVML_DEVICE_MIG_ENABLE if gpu.mig else _nv.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetMaxMigDeviceCount")
        if not gpu.mig_capable:
            _raise(nvml.NVMLError_NotSupported)
        return 7 if gpu.mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> FakeHandle:
        gpu = self._gpu(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not gpu.mig or not 0 <= index < 7:
            _raise(nvml.NVMLError_InvalidArgument)
        if index >= len(gpu.mig):
            _raise(nvml.NVMLError_NotFound)
        return FakeHandle(gpu.index, index)

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> Any:
        self._gpu(handle, "nvmlDeviceIsMigDeviceHandle")
        return ctypes.c_uint(handle.mig is not None)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any) -> FakeHandle:
        self._gpu(handle, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        if handle.mig is None:
            _raise(nvml.NVMLError_InvalidArgument)
        return FakeHandle(handle.gpu)

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetGpuInstanceId")
        if handle.mig is None:
            _raise(nvml.NVMLError_NotSupported)
        return gpu.mig[handle.mig].gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetComputeInstanceId")
        if handle.mig is None:
            _raise(nvml.NVMLError_NotSupported)
        return gpu.mig[handle.mig].compute_instance_id

    # -- links ------------------------------------------------------------
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        port = self._port(handle, link, "nvmlDeviceGetNvLinkState")
        return _nv.NVML_FEATURE_ENABLED if port is not None else _nv.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> Any:
        port = self._port(handle, link, "nvmlDeviceGetNvLinkRemotePciInfo")
        if port is None:
            _raise(nvml.NVMLError_NotSupported)
        return _pci_info(port.remote_bus_id)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        port = self._port(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType")
        if port is None:
            return _nv.NVML_NVLINK_DEVICE_TYPE_UNKNOWN
        if port.remote_is_switch:
            return _nv.NVML_NVLINK_DEVICE_TYPE_SWITCH
        return _nv.NVML_NVLINK_DEVICE_TYPE_GPU

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        a = self._gpu(device1, "nvmlDeviceGetTopologyCommonAncestor")
        b = self._gpu(device2, "nvmlDeviceGetTopologyCommonAncestor")
        return int(self.spec.pcie_level(a.index, b.index))

    # -- health -----------------------------------------------------------
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != _nv.NVML_TEMPERATURE_GPU:
            _raise(nvml.NVMLError_InvalidArgument)
        return self._faults.current().temperature.get(gpu.index, gpu.temperature_c)

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        if errorType != _nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return 0
        return self._faults.current().ecc_uncorrected.get(gpu.index, 0)

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        gpu = self._gpu(handle, "nvmlDeviceGetRemappedRows")
        pending = gpu.index in self._faults.current().remapped_rows_pending
        return (0, 0, int(pending), 0)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        faults = self._faults.current()
        busy = faults.utilization.get(gpu.index)
        if busy is None:
            each = faults.worker_utilization_pct.get(gpu.index, self.spec.worker_utilization_pct or 0)
            busy = min(100, each * len(self._workers(gpu.index, faults)))
        return _nv.c_nvmlUtilization_t(gpu=busy, memory=faults.memory_utilization.get(gpu.index, busy))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        return self._process_infos(handle, self._compute_processes(gpu.index))

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any) -> list[Any]:
        self._enter("nvmlDeviceGetComputeRunningProcesses_v3")
        return self.nvmlDeviceGetComputeRunningProcesses(handle)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self._gpu(handle, "nvmlDeviceGetMPSComputeRunningProcesses")
        return self._process_infos(handle, self._faults.current().mps_processes.get(gpu.index, ()))

    def nvmlDeviceGetMPSComputeRunningProcesses_v3(self, handle: Any) -> list[Any]:
        self._enter("nvmlDeviceGetMPSComputeRunningProcesses_v3")
        return self.nvmlDeviceGetMPSComputeRunningProcesses(handle)

    @staticmethod
    def _process_infos(handle: Any, entries: tuple[tuple[int, int], ...]) -> list[Any]:
        if handle.mig is not None:
            return []
        return [
            _nv.nvmlFriendlyObject({"pid": pid, "usedGpuMemory": mib * _MIB,
                                    "gpuInstanceId": _NO_INSTANCE, "computeInstanceId": _NO_INSTANCE})
            for pid, mib in entries
        ]

    # -- events -----------------------------------------------------------
    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._enter("nvmlEventSetCreate")
        return FakeEventSet()

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._gpu(handle, "nvmlDeviceGetSupportedEventTypes")
        return _nv.nvmlEventTypeXidCriticalError | _nv.nvmlEventTypeDoubleBitEccError

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: FakeEventSet) -> None:
        gpu = self._gpu(handle, "nvmlDeviceRegisterEvents")
        if eventSet.freed:
            _raise(nvml.NVMLError_InvalidArgument)
        eventSet.registered[gpu.index] = eventSet.registered.get(gpu.index, 0) | eventTypes

    def nvmlEventSetWait(self, eventSet: FakeEventSet, timeoutms: int) -> Any:
        """The next undelivered Xid of a registered GPU; each is delivered once."""
        self._enter("nvmlEventSetWait")
        if eventSet.freed:
            _raise(nvml.NVMLError_InvalidArgument)
        xid = _nv.nvmlEventTypeXidCriticalError
        for gpu, code, n in self._faults.current().xid_events():
            if (gpu, code, n) in self._delivered or not eventSet.registered.get(gpu, 0) & xid:
                continue
            self._delivered.add((gpu, code, n))
            return _nv.nvmlFriendlyObject({
                "device": FakeHandle(gpu), "eventType": xid, "eventData": code,
                "gpuInstanceId": _NO_INSTANCE, "computeInstanceId": _NO_INSTANCE,
            })
        if timeoutms > 0:
            time.sleep(timeoutms / 1000)
        _raise(nvml.NVMLError_Timeout)

    def nvmlEventSetWait_v2(self, eventSet: FakeEventSet, timeoutms: int) -> Any:
        self._enter("nvmlEventSetWait_v2")
        return self.nvmlEventSetWait(eventSet, timeoutms)

    def nvmlEventSetFree(self, eventSet: FakeEventSet) -> None:
        self._enter("nvmlEventSetFree")
        eventSet.freed = True
