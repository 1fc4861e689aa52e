"""The process table read on the core's behalf, on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import pytest

from computegroups.daemon.supervision import proctree
from computegroups.daemon.supervision.proctree import process_trees

TREE = ("import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import subprocess, sys, time; g = subprocess.Popen([\"sleep\", \"60\"]); print(g.pid, flush=True); "
        "time.sleep(60)'])\n"
        "time.sleep(60)\n")
"""A worker whose child starts a grandchild, which prints its pid."""


@contextmanager
def worker() -> Iterator[tuple[int, int]]:
    """(worker pid, grandchild pid), all three ended afterwards."""
    proc = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        grandchild = int(proc.stdout.readline())
        yield proc.pid, grandchild
    finally:
        family = [proc.pid]
        try:
            family += [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        except psutil.Error:
            pass
        for pid in family:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        proc.wait()
        proc.stdout.close()
        deadline = time.monotonic() + 5
        while psutil.pid_exists(grandchild) and time.monotonic() < deadline:
            time.sleep(0.02)


def test_every_roots_descendants_in_one_read_and_no_one_elses() -> None:
    with worker() as (first, first_grandchild), worker() as (second, second_grandchild):
        stranger = subprocess.Popen(["sleep", "60"])
        gone = subprocess.Popen(["true"])
        gone.wait()
        try:
            found = process_trees([first, None, second, gone.pid])
            assert {first, first_grandchild, second, second_grandchild, gone.pid} <= found
            assert stranger.pid not in found and os.getpid() not in found
            # the same answer as psutil's per-root walk, which reads /proc once per root
            each = {gone.pid}
            for root in (first, second):
                each |= {root} | {c.pid for c in psutil.Process(root).children(recursive=True)}
            assert found == each
        finally:
            stranger.kill()
            stranger.wait()


def test_no_roots_is_no_processes() -> None:
    assert process_trees([]) == set()
    assert process_trees([None]) == set()


def test_a_reused_pid_and_a_cycle_are_read_as_psutil_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table read while pids were reused: a "child" older than its root is another process that
    took a dead child's pid (left out, with what it started), and parents that point at each other
    end the walk rather than loop."""
    table = {  # pid: (parent, start in ticks)
        100: (1, 1000), 101: (100, 1010), 102: (101, 1020),
        103: (100, 900), 104: (103, 1030),
        200: (201, 2000), 201: (200, 2001),
        300: (1, 50),
    }
    monkeypatch.setattr(os, "listdir", lambda path: [str(p) for p in table] + ["self", "stat"])
    monkeypatch.setattr(proctree, "stat_fields", lambda pid: None if pid not in table else
                        [b"S", str(table[pid][0]).encode(), *[b"0"] * 17, str(table[pid][1]).encode()])
    assert process_trees([100, 200, 999, None]) == {100, 101, 102, 200, 201, 999}
    assert process_trees([None]) == set()
