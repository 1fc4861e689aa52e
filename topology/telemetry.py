"""What each GPU says about its health right now, for the daemon's health loop.

One `sample()` per tick reads memory, temperature, ECC, row remapping,
utilization and the compute processes NVML sees (foreign ones included), and
drains the critical-Xid events that arrived since the last tick. It goes
through the same gateway as discovery, so simulated machines answer too (with
the faults of `CG_SIM_FAULTS`). A value a GPU cannot report is `None`; the two
collections are empty instead, so callers can always iterate them; a GPU
that stops answering is `lost` rather than an exception.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any

from computegroups.topology.nvml import (
    UNSUPPORTED,
    NVMLError,
    NVMLError_Timeout,
    NvmlGateway,
    NvmlUnavailable,
)

_MIB = 1024 * 1024
_MAX_EVENTS_PER_SAMPLE = 10_000


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_mib: int | None


@dataclass(frozen=True)
class GpuSample:
    index: int
    uuid: str | None
    lost: bool
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    temperature_c: int | None = None
    xid_errors: tuple[int, ...] = ()
    ecc_uncorrected: int | None = None
    remapped_rows_pending: bool | None = None
    processes: tuple[GpuProcess, ...] = ()
    utilization_pct: int | None = None
    utilization_memory_pct: int | None = None


class Telemetry:
    """Samples every GPU; keeps one Xid event set across samples.

    Thread-safe: the daemon samples from an executor thread, not always the
    same one.
    """

    def __init__(self, gateway: NvmlGateway) -> None:
        self._gw = gateway
        self._lock = threading.Lock()
        self._events: Any = None
        self._events_supported = True
        self._registered: set[str] = set()
        self._uuids: dict[int, str] = {}

    def sample(self) -> tuple[GpuSample, ...]:
        with self._lock:
            count = self._gw.call("nvmlDeviceGetCount")
            present: dict[int, tuple[Any, str]] = {}
            lost: set[int] = set()
            for index in range(count):
                try:
                    handle = self._gw.call("nvmlDeviceGetHandleByIndex", index)
                    uuid = self._gw.call("nvmlDeviceGetUUID", handle)
                except NVMLError:
                    lost.add(index)
                    continue
                self._uuids[index] = uuid
                present[index] = (handle, uuid)
            xids = self._drain_xids(present)
            out = []
            for index in range(count):
                if index in lost:
                    out.append(GpuSample(index, self._uuids.get(index), lost=True))
                    continue
                handle, uuid = present[index]
                try:
                    out.append(self._read(index, handle, uuid, xids))
                except NVMLError:
                    out.append(GpuSample(index, uuid, lost=True))
            return tuple(out)

    def _read(self, index: int, handle: Any, uuid: str, xids: dict[str, list[int]]) -> GpuSample:
        gw = self._gw
        memory = gw.query("nvmlDeviceGetMemoryInfo", handle)
        remapped = gw.query("nvmlDeviceGetRemappedRows", handle)
        utilization = gw.query("nvmlDeviceGetUtilizationRates", handle)
        processes = self._processes(handle)
        return GpuSample(
            index=index,
            uuid=uuid,
            lost=False,
            memory_used_mib=memory.used // _MIB if memory is not None else None,
            memory_total_mib=memory.total // _MIB if memory is not None else None,
            temperature_c=gw.query("nvmlDeviceGetTemperature", handle, gw.constant("NVML_TEMPERATURE_GPU")),
            xid_errors=tuple(xids.get(uuid, ())),
            ecc_uncorrected=gw.query("nvmlDeviceGetTotalEccErrors", handle,
                                     gw.constant("NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
                                     gw.constant("NVML_VOLATILE_ECC")),
            remapped_rows_pending=bool(remapped[2]) if remapped is not None else None,
            processes=tuple(
                GpuProcess(p.pid, p.usedGpuMemory // _MIB if p.usedGpuMemory is not None else None)
                for p in processes
            ),
            utilization_pct=utilization.gpu if utilization is not None else None,
            utilization_memory_pct=utilization.memory if utilization is not None else None,
        )

    def _processes(self, handle: Any) -> list[Any]:
        """The processes using the GPU, MPS clients included.

        Under MPS, NVML lists the MPS server among the compute processes and
        its clients apart; the clients (cgd's workers) are what a share is
        checked against, and the server, whose memory is theirs, is left out.
        """
        compute = self._versioned(handle, "nvmlDeviceGetComputeRunningProcesses")
        clients = self._versioned(handle, "nvmlDeviceGetMPSComputeRunningProcesses")
        if not clients:
            return compute
        theirs = {p.pid for p in clients}
        return [p for p in compute if p.pid not in theirs and not _is_mps_server(p.pid)] + clients

    def _versioned(self, handle: Any, name: str) -> list[Any]:
        """Versioned calls only: pynvml's unversioned one raises a non-NVML error
        on drivers that lack `_v3`, where `_v2` still answers."""
        for fn in (f"{name}_v3", f"{name}_v2"):
            found = self._gw.query(fn, handle)
            if found is not None:
                return list(found)
        return []

    def _drain_xids(self, present: dict[int, tuple[Any, str]]) -> dict[str, list[int]]:
        """Critical Xid codes by GPU UUID, each event once (NVML queues them for us)."""
        if not self._events_supported:
            return {}
        gw = self._gw
        if self._events is None:
            try:
                self._events = gw.call("nvmlEventSetCreate")
            except UNSUPPORTED:
                self._events_supported = False
                return {}
        xid = gw.constant("nvmlEventTypeXidCriticalError")
        for handle, uuid in present.values():
            if uuid in self._registered:
                continue
            supported = gw.query("nvmlDeviceGetSupportedEventTypes", handle)
            if supported is not None and not supported & xid:
                continue
            try:
                gw.call("nvmlDeviceRegisterEvents", handle, xid, self._events)
            except NVMLError:
                continue  # unsupported, or lost meanwhile: tried again next sample
            self._registered.add(uuid)
        out: dict[str, list[int]] = {}
        for _ in range(_MAX_EVENTS_PER_SAMPLE):
            try:
                event = gw.call("nvmlEventSetWait", self._events, 0)
            except NVMLError_Timeout:
                break
            except NVMLError:
                break  # a GPU in the set fell off mid-wait; its loss shows up in the sample
            if not event.eventType & xid:
                continue
            try:
                uuid = gw.call("nvmlDeviceGetUUID", event.device)
            except NVMLError:
                continue
            out.setdefault(uuid, []).append(int(event.eventData))
        return out

    def close(self) -> None:
        with self._lock:
            if self._events is not None:
                # NVML already shut down takes the set with it: nothing left to free.
                with contextlib.suppress(NVMLError, NvmlUnavailable):
                    self._gw.call("nvmlEventSetFree", self._events)
                self._events = None


def _is_mps_server(pid: int) -> bool:
    """`nvidia-cuda-mps-server` (its comm, cut to 15 characters, is `nvidia-cuda-mps`)."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip().startswith("nvidia-cuda-mps")
    except OSError:
        return False
