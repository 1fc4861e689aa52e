"""The health rules, on samples built by hand: no daemon needed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from computegroups.daemon.core.health import assess
from computegroups.daemon.model.config import HealthConfig
from computegroups.daemon.supervision.proctree import owners_of
from computegroups.topology.telemetry import GpuProcess, GpuSample


def sample(index: int, **kw: Any) -> GpuSample:
    base: dict[str, Any] = dict(
        index=index, uuid=f"GPU-{index}", lost=False, memory_used_mib=0, memory_total_mib=81559,
        temperature_c=40, xid_errors=(), ecc_uncorrected=0, remapped_rows_pending=False,
        processes=(), utilization_pct=0,
    )
    base.update(kw)
    return GpuSample(**base)


def test_healthy_gpus_stay_ok() -> None:
    facts = assess((sample(0), sample(1)), HealthConfig(), {}, {})
    assert all(f.health == "ok" and not f.reasons for f in facts.values())


def test_each_failure_is_named() -> None:
    facts = assess(
        (sample(0, lost=True), sample(1, xid_errors=(79,)), sample(2, xid_errors=(13,)),
         sample(3, ecc_uncorrected=2), sample(4, temperature_c=95), sample(5, remapped_rows_pending=True)),
        HealthConfig(), {}, {},
    )
    assert facts[0].health == "lost"
    assert facts[1].health == "failed" and "79" in facts[1].reasons[0]
    assert facts[2].health == "ok", "Xid 13 (a program's own fault) is not critical"
    assert facts[3].health == "failed" and "ECC" in facts[3].reasons[0]
    assert facts[4].health == "failed" and "temperature" in facts[4].reasons[0]
    assert facts[5].health == "failed" and "remapping" in facts[5].reasons[0]


def test_foreign_processes_and_shares() -> None:
    procs = (GpuProcess(100, 30000), GpuProcess(101, 5000), GpuProcess(555, 2048))
    facts = assess((sample(0, processes=procs),), HealthConfig(), {100: "a/0", 101: "a/0"},
                   {("a/0", 0): 20480})
    f = facts[0]
    assert f.foreign == [{"pid": 555, "used_memory_mib": 2048}]
    assert f.over_share == [{"replica": "a/0", "used_memory_mib": 35000, "share_mib": 20480}]


def test_whole_gpu_holders_have_no_share_limit() -> None:
    facts = assess((sample(0, processes=(GpuProcess(100, 80000),)),), HealthConfig(), {100: "a/0"}, {})
    assert facts[0].over_share == [] and facts[0].foreign == []


def test_a_workers_descendants_are_its_own_and_nothing_else_is() -> None:
    """Real processes: a worker whose child forks the process that uses the GPU."""
    tree = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(60)\n")
    worker = subprocess.Popen([sys.executable, "-c", tree], stdout=subprocess.PIPE, text=True)
    assert worker.stdout is not None
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        grandchild = int(worker.stdout.readline())
        gone = subprocess.Popen(["true"])
        gone.wait()
        found = owners_of([worker.pid, grandchild, stranger.pid, os.getpid(), gone.pid], {worker.pid: "w/0"})
        assert found == {worker.pid: "w/0", grandchild: "w/0"}
    finally:
        for p in (worker, stranger):
            p.kill()
            p.wait()
        worker.stdout.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.kill(grandchild, 9)
            except ProcessLookupError:
                break
            time.sleep(0.05)


def test_health_events_count_what_is_new_in_a_sample() -> None:
    from computegroups.daemon.core.health import health_events

    before = {0: sample(0, ecc_uncorrected=2), 1: sample(1), 2: sample(2, temperature_c=95), 3: sample(3)}
    now = (sample(0, ecc_uncorrected=5, xid_errors=(79, 79)), sample(1, lost=True),
           sample(2, temperature_c=96), sample(3, temperature_c=91, remapped_rows_pending=True))
    found = [(s.index, kind, n) for s, kind, n in health_events(before, now, 90)]
    assert found == [(0, "xid", 2), (0, "ecc", 3), (1, "lost", 1), (3, "temperature", 1), (3, "remapped_rows", 1)]
    again = {s.index: s for s in now}
    assert health_events(again, tuple(again.values()), 90) == [
        (now[0], "xid", 2)], "a GPU still lost, still hot, still pending is not counted again (Xids are new ones)"


def test_old_ecc_errors_are_not_counted_as_new() -> None:
    from computegroups.daemon.core.health import health_events

    old = (sample(0, ecc_uncorrected=12), sample(1, ecc_uncorrected=12))
    assert health_events({}, old, 90) == [], "a first sample's errors happened before cgd looked"
    unknown = {0: sample(0, ecc_uncorrected=None), 1: sample(1, ecc_uncorrected=12)}
    assert health_events(unknown, old, 90) == [], "after an unknown reading, nothing is known to be new"
    later = (sample(0, ecc_uncorrected=None), sample(1, ecc_uncorrected=14))
    assert [(s.index, kind, n) for s, kind, n in health_events({s.index: s for s in old}, later, 90)] == [
        (1, "ecc", 2)]
