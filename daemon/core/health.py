"""What the GPUs and processes say, turned into decisions every few seconds.

`assess` is pure (samples in, facts out) so the rules can be tested without a
daemon; `HealthMonitor` runs it on a timer and asks the manager to act:
drain failed GPUs, count foreign memory, catch workers over their share,
release leases whose client died and reservations that expired.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from computegroups.daemon.model.config import HealthConfig
from computegroups.daemon.supervision.proctree import owners_of
from computegroups.topology.telemetry import GpuSample

if TYPE_CHECKING:
    from computegroups.daemon.core.manager import Manager

log = logging.getLogger("cgd.health")


@dataclass
class GpuFacts:
    health: str = "ok"
    reasons: list[str] = field(default_factory=list)
    foreign: list[dict[str, Any]] = field(default_factory=list)
    over_share: list[dict[str, Any]] = field(default_factory=list)
    temperature_c: int | None = None
    used_by_worker: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "health": self.health, "reasons": list(self.reasons), "foreign": list(self.foreign),
            "over_share": list(self.over_share), "temperature_c": self.temperature_c,
        }


def assess(
    samples: tuple[GpuSample, ...], config: HealthConfig, worker_of_pid: Mapping[int, str],
    shares: Mapping[tuple[str, int], int],
) -> dict[int, GpuFacts]:
    """Judge each GPU from one sample.

    `worker_of_pid` maps the GPU processes cgd owns (workers and their
    descendants) to their replica refs; `shares` gives (ref, gpu) -> MiB the replica may use
    on that GPU when it holds a share rather than the whole device.
    """
    facts: dict[int, GpuFacts] = {}
    for s in samples:
        f = GpuFacts(temperature_c=s.temperature_c)
        if s.lost:
            f.health = "lost"
            f.reasons.append("GPU is lost (fell off the bus or stopped answering)")
        critical = [x for x in s.xid_errors if x in config.critical_xids]
        if critical:
            f.reasons.append("critical Xid " + ", ".join(str(x) for x in critical))
        if config.drain_on_ecc and s.ecc_uncorrected:
            f.reasons.append(f"{s.ecc_uncorrected} uncorrected ECC errors")
        if s.remapped_rows_pending:
            f.reasons.append("row remapping pending: reset the GPU")
        if s.temperature_c is not None and s.temperature_c >= config.max_temperature_c:
            f.reasons.append(f"temperature {s.temperature_c} C >= {config.max_temperature_c} C")
        if f.reasons and f.health == "ok":
            f.health = "failed"
        for proc in s.processes:
            ref = worker_of_pid.get(proc.pid)
            if ref is None:
                f.foreign.append({"pid": proc.pid, "used_memory_mib": proc.used_memory_mib})
            else:
                f.used_by_worker[ref] = f.used_by_worker.get(ref, 0) + (proc.used_memory_mib or 0)
        for ref, used in sorted(f.used_by_worker.items()):
            limit = shares.get((ref, s.index))
            if limit is not None and used > limit:
                f.over_share.append({"replica": ref, "used_memory_mib": used, "share_mib": limit})
        facts[s.index] = f
    return facts


"""Deeper process trees than this are not followed: a guard against a pid loop read mid-reuse."""


class HealthMonitor:
    """The periodic loop; every decision it makes goes through the manager."""

    def __init__(self, manager: Manager, telemetry, config: HealthConfig) -> None:
        self.manager = manager
        self.telemetry = telemetry
        self.config = config
        self.facts: dict[int, GpuFacts] = {}
        self.samples: tuple[GpuSample, ...] = ()
        """The latest sample only: a measurement shown as it was taken, never kept beside the state."""
        self.last_sample: float | None = None
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("health check failed; trying again next interval")
            await asyncio.sleep(self.config.interval_s)

    async def tick(self) -> None:
        samples: tuple[GpuSample, ...] = ()
        if self.telemetry is not None:
            samples = await asyncio.get_running_loop().run_in_executor(None, self.telemetry.sample)
        on_gpus = {p.pid for s in samples for p in s.processes}
        # Whose the GPU processes are matters only when NVML lists some: finding every worker's own
        # pid reads its launch shim's status file, a hundred reads a tick for a hundred idle workers.
        roots, shares = self.manager.worker_pids_and_shares() if on_gpus else ({}, {})
        self.facts = assess(samples, self.config, owners_of(on_gpus, roots), shares)
        self._count(self.samples, samples)
        self.samples = samples
        self.last_sample = self.manager.keeper.clock()
        await self.manager.apply_health(self.facts)
        await self.manager.expire()
        await self.manager.expire_jobs()

    def _count(self, before: tuple[GpuSample, ...], now: tuple[GpuSample, ...]) -> None:
        """Count each GPU's health events of this sample (`computegroups_gpu_health_events`)."""
        machine = self.manager.keeper.machine
        counter = self.manager.keeper.instruments.health_events
        previous = {s.index: s for s in before}
        for s, kind, n in health_events(previous, now, self.config.max_temperature_c):
            try:
                gpu = machine.gpu(s.index)
            except KeyError:
                continue  # NVML lists a GPU discovery did not: not one cgd manages
            counter.labels(str(s.index), gpu.uuid, gpu.name, machine.hostname, gpu.pci_bus_id, kind).inc(n)

    def as_dict(self) -> dict[int, dict[str, Any]]:
        return {index: f.as_dict() for index, f in self.facts.items()}

    def measured(self) -> dict[int, dict[str, Any]]:
        """What NVML said of each GPU at the last sample (GpuStatus `measured`); empty before it."""
        return {s.index: measured_view(s, self.last_sample) for s in self.samples}

    def used_by_replica(self) -> dict[int, dict[str, int]]:
        """MiB each replica's processes used on each GPU at the last sample, for the GPUs
        that answered (a lost GPU's use is unknown, not zero)."""
        return {s.index: dict(self.facts[s.index].used_by_worker) for s in self.samples
                if not s.lost and s.index in self.facts}


def health_events(previous: Mapping[int, GpuSample], now: tuple[GpuSample, ...],
                  max_temperature_c: int) -> list[tuple[GpuSample, str, int]]:
    """(sample, kind, how many) of what is new in this sample: Xids, ECC errors, a loss,
    the temperature crossing its limit, a row remapping becoming pending."""
    out = []
    for s in now:
        p = previous.get(s.index)
        if s.xid_errors:
            out.append((s, "xid", len(s.xid_errors)))
        if s.lost:
            if p is None or not p.lost:
                out.append((s, "lost", 1))
            continue
        # NVML's count is since the driver loaded: only a rise between two known readings is new
        # (the first sample, or one after an unknown reading, holds errors counted or not before).
        ecc = 0
        if p is not None and s.ecc_uncorrected is not None and p.ecc_uncorrected is not None:
            ecc = s.ecc_uncorrected - p.ecc_uncorrected
        if ecc > 0:
            out.append((s, "ecc", ecc))
        hot = s.temperature_c is not None and s.temperature_c >= max_temperature_c
        was_hot = p is not None and p.temperature_c is not None and p.temperature_c >= max_temperature_c
        if hot and not was_hot:
            out.append((s, "temperature", 1))
        if s.remapped_rows_pending and not (p is not None and p.remapped_rows_pending):
            out.append((s, "remapped_rows", 1))
    return out


def measured_view(s: GpuSample, sampled_at: float | None) -> dict[str, Any]:
    return {
        "utilization_gpu_pct": s.utilization_pct, "utilization_memory_pct": s.utilization_memory_pct,
        "memory_used_mib": s.memory_used_mib, "temperature_c": s.temperature_c,
        "sampled_at": sampled_at,
    }
