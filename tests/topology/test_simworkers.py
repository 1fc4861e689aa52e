"""A simulated GPU lists the processes of this cgd's workers that name it, with the numbers asked for."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from computegroups.topology import simulated_gateway
from computegroups.topology.fakenvml import FakeNvml
from computegroups.topology.simworkers import MarkedProcesses
from computegroups.topology.telemetry import Telemetry

MARK = ("CG_INSTANCE", f"/test-simworkers-{uuid.uuid4()}")
"""Unique to this run: another run's processes (or this one's, left behind) carry another."""
TREE = ("import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n")


@pytest.fixture
def workers() -> Iterator[dict[str, int]]:
    """A worker on GPU 1 that forks a child (the child holds the 'context'), one on GPU 2 by UUID,
    and one of another cgd on GPU 1."""
    fake = FakeNvml("dgx-h100")
    base = {k: v for k, v in os.environ.items() if k != "CG_INSTANCE"}
    procs: list[subprocess.Popen[str]] = [
        subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True,
                         env={**base, MARK[0]: MARK[1], "CUDA_VISIBLE_DEVICES": "1"}),
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], text=True,
                         env={**base, MARK[0]: MARK[1], "CUDA_VISIBLE_DEVICES": fake.spec.gpus[2].uuid}),
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], text=True,
                         env={**base, MARK[0]: "/elsewhere", "CUDA_VISIBLE_DEVICES": "1"}),
    ]
    child = None
    try:
        assert procs[0].stdout is not None
        child = int(procs[0].stdout.readline())
        yield {"parent": procs[0].pid, "child": child, "by_uuid": procs[1].pid, "other": procs[2].pid}
    finally:
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        for p in procs:
            p.kill()
            p.wait()
        if procs[0].stdout is not None:
            procs[0].stdout.close()


def sample(fake: FakeNvml):
    with simulated_gateway(fake) as gateway:
        gateway.start()
        return Telemetry(gateway).sample()


def test_workers_are_listed_where_they_run(workers: dict[str, int], tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    faults.write_text(json.dumps({"worker_memory_mib": {"1": 700, "2": 300}, "worker_utilization_pct": {"1": 35}}))
    fake = FakeNvml("dgx-h100", faults_file=faults, worker_mark=MARK)
    hours = itertools.count(0.0, 3600.0)
    assert fake._marked is not None
    fake._marked.clock = lambda: next(hours)  # each sample an hour after the last: each scans /proc afresh
    deadline = time.monotonic() + 10
    while True:
        s = sample(fake)
        if {p.pid for p in s[1].processes} == {workers["child"]} or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert [(p.pid, p.used_memory_mib) for p in s[1].processes] == [(workers["child"], 700)], \
        "the leaf only, and not another cgd's worker"
    assert s[1].memory_used_mib == 700 and s[1].utilization_pct == 35
    assert [(p.pid, p.used_memory_mib) for p in s[2].processes] == [(workers["by_uuid"], 300)]
    assert s[2].utilization_pct == 0, "the utilization asked for GPU 1 only"
    assert s[0].processes == () and s[0].memory_used_mib == 0


def test_without_simulate_or_faults_no_worker_is_listed(workers: dict[str, int]) -> None:
    s = sample(FakeNvml("dgx-h100", worker_mark=MARK))
    assert all(g.processes == () for g in s)


def test_one_scan_serves_the_calls_of_one_sample(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    marked = MarkedProcesses(MARK, {}, 8, proc=str(tmp_path), clock=lambda: now[0])
    scans: list[float] = []
    real = marked._scan

    def scan() -> dict[int, tuple[int, ...]]:
        scans.append(now[0])
        return real()

    monkeypatch.setattr(marked, "_scan", scan)
    marked.by_gpu()
    now[0] += 0.1
    marked.by_gpu()
    assert scans == [100.0], "within the cache period: the first scan's answer"
    now[0] += 1.0
    marked.by_gpu()
    assert scans == [100.0, 101.1]
