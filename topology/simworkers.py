"""Which processes a simulated GPU is used by: what a real driver knows from CUDA contexts.

A real GPU lists the processes that opened a context on it. A simulated one
has no contexts, so the fake driver takes a process to use the GPUs its
`CUDA_VISIBLE_DEVICES` names, as CUDA would open them, provided it carries
the mark that ties it to this simulated machine (cgd passes its
`CG_INSTANCE`): processes of another daemon on the same simulated machine,
in a test run beside this one, stay out. Of a marked process tree only the
leaves count, as a shell that waits for its program holds no context.

It reads /proc directly (environment and parent of each process), like
telemetry's MPS check: `topology/` may not import the process library, and
only the fake, when a machine file or fault file asks for workers, calls it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

_CACHE_S = 0.5
"""One scan serves every NVML call of a sample (memory, processes, utilization of each GPU)."""


class MarkedProcesses:
    """The GPUs each marked process uses, rescanned at most every `_CACHE_S`."""

    def __init__(self, mark: tuple[str, str], uuids: Mapping[str, int], count: int,
                 proc: str = "/proc", clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        """What the cache's age is read from: a test that waits for a process to show moves it on."""
        self._entry = f"{mark[0]}={mark[1]}".encode()
        self._uuids = dict(uuids)
        self._count = count
        self._proc = proc
        self._at = -_CACHE_S
        self._by_gpu: dict[int, tuple[int, ...]] = {}

    def by_gpu(self) -> dict[int, tuple[int, ...]]:
        now = self.clock()
        if now - self._at >= _CACHE_S:
            self._by_gpu = self._scan()
            self._at = now
        return self._by_gpu

    def _scan(self) -> dict[int, tuple[int, ...]]:
        gpus_of: dict[int, tuple[int, ...]] = {}
        parent: dict[int, int] = {}
        try:
            entries = os.listdir(self._proc)
        except OSError:
            return {}
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                with open(f"{self._proc}/{entry}/environ", "rb") as f:
                    environ = f.read().split(b"\0")
            except OSError:
                continue  # gone, or another user's
            if self._entry not in environ:
                continue
            pid = int(entry)
            gpus_of[pid] = self._visible(environ)
            ppid = _parent(self._proc, pid)
            if ppid is not None:
                parent[pid] = ppid
        inner = {parent[pid] for pid in gpus_of if pid in parent}
        out: dict[int, list[int]] = {}
        for pid, gpus in sorted(gpus_of.items()):
            if pid in inner:
                continue
            for gpu in gpus:
                out.setdefault(gpu, []).append(pid)
        return {gpu: tuple(pids) for gpu, pids in out.items()}

    def _visible(self, environ: list[bytes]) -> tuple[int, ...]:
        """The GPUs CUDA_VISIBLE_DEVICES names (indices in PCI order, or GPU-/MIG- UUIDs)."""
        value = next((e[len(b"CUDA_VISIBLE_DEVICES="):] for e in environ
                      if e.startswith(b"CUDA_VISIBLE_DEVICES=")), None)
        if value is None:
            return ()
        found: list[int] = []
        for name in value.decode(errors="replace").split(","):
            name = name.strip()
            index = int(name) if name.isdigit() else self._uuids.get(name)
            if index is not None and 0 <= index < self._count and index not in found:
                found.append(index)
        return tuple(found)


def _parent(proc: str, pid: int) -> int | None:
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'.
    fields = stat[stat.rfind(b")") + 2:].split()
    return int(fields[1]) if len(fields) > 1 else None
