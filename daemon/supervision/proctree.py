"""Reading the process table on the core's behalf: marks, trees, ancestry, liveness.

Only supervision reads or touches processes; the core asks these questions
(which processes carry this cgd's mark, which worker owns a pid NVML
reported, is a lease holder still the process it was) and gets plain
answers back.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import psutil

from computegroups.daemon.supervision.processes import SAME_START_S, stat_fields

MAX_DEPTH = 64
"""Parents walked up from a GPU process before it is called foreign."""


def marked_processes(marks: Mapping[str, str]) -> list[tuple[int, float, dict[str, str]]]:
    """(pid, start time, environment) of every process whose environment has each of `marks`.

    Workers inherit the marks and so do their children, even those that left
    the worker's process group (setsid, a double fork), so a worker's helpers
    are found even when the worker itself is gone.
    """
    found = []
    wanted = [f"{var}={value}".encode() for var, value in marks.items()]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        items = raw.split(b"\0")
        if not all(w in items for w in wanted):
            continue
        env = dict(item.decode(errors="replace").split("=", 1) for item in items if b"=" in item)
        try:
            found.append((pid, psutil.Process(pid).create_time(), env))
        except psutil.Error:
            continue
    return found


def process_trees(roots: Iterable[int | None]) -> set[int]:
    """Each of `roots` and every descendant of it that is alive now.

    The process table is read once for all roots, one /proc/PID/stat each:
    psutil's `children` reads it once per call (recovery with a hundred
    workers read /proc a hundred times), and its Process objects read
    /proc/stat besides for the boot time, to turn each start into a date.
    As in psutil's `children`, a process that started before its root did
    is left out: its pid was reused after the root's own child with that pid
    ended. Start times are compared in clock ticks since boot, as the kernel
    gives them. A root that is gone is kept alone.
    """
    wanted = {pid for pid in roots if pid is not None}
    if not wanted:
        return set()
    started: dict[int, int] = {}
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(int(entry))
        if fields is None:
            continue
        started[int(entry)] = int(fields[19])
        children.setdefault(int(fields[1]), []).append(int(entry))
    found = set(wanted)
    for root in wanted:
        if root not in started:
            continue
        stack, seen = [root], set()
        while stack:
            pid = stack.pop()
            if pid in seen:
                continue  # a cycle, read while pids were reused
            seen.add(pid)
            for child in children.get(pid, ()):
                if started[root] <= started[child]:
                    found.add(child)
                    stack.append(child)
    return found


def owners_of(pids: Iterable[int], roots: Mapping[int, str]) -> dict[int, str]:
    """The worker each of `pids` belongs to: itself, or an ancestor of it
    (a CUDA process may be a worker's child).

    Only the processes NVML reported are looked at, walking up their parents,
    so a tick costs nothing per idle worker; the pids owned by no worker are
    left out (foreign).
    """
    out: dict[int, str] = {}
    for pid in pids:
        current, hops = pid, 0
        while current > 1 and current not in roots and hops < MAX_DEPTH:
            try:
                current = psutil.Process(current).ppid()
            except psutil.Error:
                break
            hops += 1
        if current in roots:
            out[pid] = roots[current]
    return out


def is_alive(pid: int, start: float | None) -> bool:
    """Whether `pid` runs and, when `start` is known, is still the process that started then."""
    try:
        proc = psutil.Process(pid)
        return start is None or abs(proc.create_time() - start) < SAME_START_S
    except psutil.Error:
        return False
