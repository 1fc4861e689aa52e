"""Workers a lost generation of the state started: kept running, reported, and their GPUs held.

After a fallback to an older state (see recovery.py) cgd finds processes
carrying its mark whose component the state has never heard of. Their owners
did not ask for them to end, so they keep running; but they still hold the
GPUs cgd once gave them, and a placement that ignored that would hand one GPU
to two owners. So until each one's processes have all ended, the GPUs its
environment names are unavailable, whether or not an operator has
acknowledged the loss (the acknowledgement only stops the warning).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from computegroups.daemon.supervision.processes import start_time
from computegroups.topology.model import Machine


@dataclass
class LostWorker:
    replica: str
    user: str
    devices: str
    """CUDA_VISIBLE_DEVICES as cgd set it for the worker."""
    gpus: tuple[int, ...]
    processes: list[tuple[int, float]]
    """(pid, start time): a pid reused by another process is not this worker's."""
    acknowledged: bool = False

    def running(self) -> bool:
        return any(start_time(pid) == started for pid, started in self.processes)

    def as_dict(self) -> dict[str, Any]:
        return {"replica": self.replica, "pids": [pid for pid, _ in self.processes], "user": self.user,
                "devices": self.devices, "gpus": list(self.gpus)}


def gpus_named(visible: str, machine: Machine) -> tuple[int, ...]:
    """The GPU indices a CUDA_VISIBLE_DEVICES value names: indices, GPU UUIDs, or MIG
    devices (their GPU). A name this machine does not know names no GPU here."""
    by_uuid = {g.uuid: g.index for g in machine.gpus}
    mig_parent = {m.uuid: g.index for g in machine.gpus for m in g.mig_devices}
    found = set()
    for name in filter(None, (part.strip() for part in visible.split(","))):
        if name.isdigit():
            if int(name) < len(machine.gpus):
                found.add(int(name))
        elif name in by_uuid:
            found.add(by_uuid[name])
        elif name in mig_parent:
            found.add(mig_parent[name])
    return tuple(sorted(found))
