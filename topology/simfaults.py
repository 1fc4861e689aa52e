"""Faults injected into a simulated machine through a JSON file.

The daemon's health loop is tested against the fake NVML; tests (and people
trying the daemon on a laptop) break GPUs by writing a small JSON file named
by `CG_SIM_FAULTS`. It is re-read whenever it changes, so a running daemon
sees faults appear and disappear. Format in `docs/machine-files.md`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAULTS_ENV = "CG_SIM_FAULTS"
_KEYS = {"xid", "lost", "processes", "mps_processes", "temperature", "ecc_uncorrected",
         "remapped_rows_pending", "utilization", "memory_utilization", "worker_memory_mib",
         "worker_utilization_pct"}


class FaultFileError(ValueError):
    """A fault file with a mistake; the message names the file and the key."""


@dataclass(frozen=True)
class Faults:
    xid: tuple[tuple[int, int], ...] = ()
    lost: frozenset[int] = frozenset()
    processes: Mapping[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    mps_processes: Mapping[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    """Clients of an MPS server: NVML lists them apart from the compute processes."""
    temperature: Mapping[int, int] = field(default_factory=dict)
    ecc_uncorrected: Mapping[int, int] = field(default_factory=dict)
    remapped_rows_pending: frozenset[int] = frozenset()
    utilization: Mapping[int, int] = field(default_factory=dict)
    memory_utilization: Mapping[int, int] = field(default_factory=dict)
    worker_memory_mib: Mapping[int, int] = field(default_factory=dict)
    """Per GPU, what each cgd worker on it uses: over the machine file's `[simulate]`."""
    worker_utilization_pct: Mapping[int, int] = field(default_factory=dict)

    def xid_events(self) -> tuple[tuple[int, int, int], ...]:
        """(gpu, code, n): the n-th identical entry is a distinct event, so an
        appended repeat is delivered while a re-read of the same file is not."""
        seen: dict[tuple[int, int], int] = {}
        out = []
        for gpu, code in self.xid:
            n = seen.get((gpu, code), 0)
            seen[(gpu, code)] = n + 1
            out.append((gpu, code, n))
        return tuple(out)


NO_FAULTS = Faults()


class FaultSource:
    """The current faults, re-read only when the file's mtime or size changes."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self._explicit = Path(path) if path is not None else None
        self._stamp: tuple[str, int, int] | None = None
        self._faults = NO_FAULTS

    def current(self) -> Faults:
        path = self._explicit
        if path is None:
            env = os.environ.get(FAULTS_ENV)
            path = Path(env) if env else None
        if path is None:
            return NO_FAULTS
        try:
            st = path.stat()
        except FileNotFoundError:
            self._stamp, self._faults = None, NO_FAULTS
            return NO_FAULTS
        stamp = (str(path), st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                data = json.loads(path.read_text(encoding="utf-8") or "{}")
            except json.JSONDecodeError:
                # Caught halfway through a write: keep the last faults, retry next time.
                return self._faults
            self._faults = parse_faults(data, str(path))
            self._stamp = stamp
        return self._faults


def parse_faults(data: Any, label: str) -> Faults:
    def fail(key: str, message: str) -> FaultFileError:
        return FaultFileError(f"{label}: {key}: {message}")

    def integer(value: Any, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise fail(key, "expected a non-negative integer")
        return value

    def per_gpu(key: str) -> dict[int, int]:
        table = data.get(key, {})
        if not isinstance(table, dict):
            raise fail(key, 'expected an object like {"2": 95}')
        out = {}
        for gpu, value in table.items():
            try:
                index = int(gpu)
            except ValueError:
                raise fail(f"{key}.{gpu}", "keys are GPU indices") from None
            out[index] = integer(value, f"{key}.{gpu}")
        return out

    def gpu_list(key: str) -> frozenset[int]:
        value = data.get(key, [])
        if not isinstance(value, list):
            raise fail(key, "expected a list of GPU indices")
        return frozenset(integer(v, f"{key}[{i}]") for i, v in enumerate(value))

    def entries(key: str, fields: tuple[str, ...]) -> list[tuple[int, ...]]:
        value = data.get(key, [])
        if not isinstance(value, list):
            raise fail(key, "expected a list of objects")
        out = []
        for i, item in enumerate(value):
            if not isinstance(item, dict) or set(item) != set(fields):
                raise fail(f"{key}[{i}]", "expected an object with exactly " + ", ".join(fields))
            out.append(tuple(integer(item[f], f"{key}[{i}].{f}") for f in fields))
        return out

    if not isinstance(data, dict):
        raise FaultFileError(f"{label}: expected a JSON object")
    unknown = set(data) - _KEYS
    if unknown:
        raise fail(min(unknown), "unknown key; known: " + ", ".join(sorted(_KEYS)))
    def by_gpu(key: str) -> dict[int, tuple[tuple[int, int], ...]]:
        found: dict[int, list[tuple[int, int]]] = {}
        for gpu, pid, mib in entries(key, ("gpu", "pid", "used_memory_mib")):
            found.setdefault(gpu, []).append((pid, mib))
        return {gpu: tuple(p) for gpu, p in found.items()}

    return Faults(
        xid=tuple((gpu, code) for gpu, code in entries("xid", ("gpu", "code"))),
        lost=gpu_list("lost"),
        processes=by_gpu("processes"),
        mps_processes=by_gpu("mps_processes"),
        temperature=per_gpu("temperature"),
        ecc_uncorrected=per_gpu("ecc_uncorrected"),
        remapped_rows_pending=gpu_list("remapped_rows_pending"),
        utilization=per_gpu("utilization"),
        memory_utilization=per_gpu("memory_utilization"),
        worker_memory_mib=per_gpu("worker_memory_mib"),
        worker_utilization_pct=per_gpu("worker_utilization_pct"),
    )
