"""Load and faults: clients allocate, scale, shadow and release while workers
and cgd are killed at random; after every round every invariant holds.

The short form runs in CI (`slow`); `--long` runs more rounds, more clients
and more kills. A failure names its seed and round: rerun with the same seed
to see it again (the interleaving of threads still varies).
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from msgspec.structs import replace

from tests.daemon_fixture import Cgd, wait_for
from tests.reliability.chaos import WORKER, Client, Monkey, Outcome
from tests.reliability.invariants import (
    Ledger,
    acknowledged,
    capacity,
    check_all,
    gpu_memory,
    load,
    processes,
)

pytestmark = pytest.mark.slow


def rounds_of_chaos(cgd: Cgd, seed: int, rounds: int, clients: int, ops: int,
                    worker_kills: int, cgd_kills: int) -> Outcome:
    ledger, lock, outcome = Ledger(), threading.Lock(), Outcome()
    memory = gpu_memory(cgd)
    for round_no in range(rounds):
        base = seed * 1000 + round_no * 100
        threads = [Client(cgd, ledger, lock, outcome, f"c{i}", base + i, ops, round_no) for i in range(clients)]
        monkey = Monkey(cgd, base + 99, duration=ops * 0.04, worker_kills=worker_kills, cgd_kills=cgd_kills)
        for t in (*threads, monkey):
            t.start()
        for t in (*threads, monkey):
            t.join(timeout=120)
            assert not t.is_alive(), f"{t.name} is stuck (seed {seed}, round {round_no})"
        assert monkey.error is None, f"the monkey failed: {monkey.error!r}\n{cgd.log()}"
        assert cgd.proc is not None and cgd.proc.poll() is None, f"cgd died on its own:\n{cgd.log()}"
        problems = check_all(cgd, ledger, memory)
        assert not problems, (f"seed {seed}, round {round_no}:\n  " + "\n  ".join(problems)
                              + f"\n--- cgd log ---\n{cgd.log()}")
        assert not outcome.server_errors, outcome.server_errors
    return outcome


def released_everything(cgd: Cgd) -> None:
    """The end of the run: releasing all leaves no group and no process behind."""
    status, reply = cgd.request("DELETE", "/v1/components?all=true", timeout=60)
    assert status == 200, reply
    doc = load(cgd)
    assert doc.components == {} and doc.groups == {} and doc.workers == {}
    assert cgd.worker_pids() == []


@pytest.mark.parametrize("seed", [1, 2])
def test_invariants_hold_under_load_and_kills(cgd: Cgd, seed: int) -> None:
    outcome = rounds_of_chaos(cgd, seed, rounds=3, clients=4, ops=30, worker_kills=4, cgd_kills=1)
    assert outcome.answers.get(201), "the clients never got an allocation: the test tested nothing"
    released_everything(cgd)


@pytest.mark.long
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("seed", range(10, 15))
def test_invariants_hold_under_long_load_and_kills(cgd: Cgd, seed: int) -> None:
    outcome = rounds_of_chaos(cgd, seed, rounds=12, clients=6, ops=60, worker_kills=8, cgd_kills=2)
    assert outcome.answers.get(201) and outcome.lost_answers + outcome.not_sent, outcome
    released_everything(cgd)


def test_invariant_checks_catch_what_they_claim(cgd: Cgd) -> None:
    """The checks must be able to fail: break each invariant and see it named."""
    status, _ = cgd.request("POST", "/v1/components", {"name": "a", "claim": {"gpus": 1}, "command": WORKER})
    assert status == 201
    assert check_all(cgd, Ledger(replicas={"a": 1}), gpu_memory(cgd), timeout=10) == []
    doc = load(cgd)
    doc.groups["b-0"] = replace(doc.groups["a-0"], id="b-0", owner="b", users=("b/0",))
    assert any("held whole" in p for p in capacity(doc, gpu_memory(cgd)))

    ledger = Ledger(replicas={"a": 2, "ghost": 1}, gone={"a"})
    found = "\n".join(acknowledged(load(cgd), ledger))
    assert "ghost was acknowledged but is missing" in found and "a has 1 replicas, 2 were acknowledged" in found
    assert "a is in the state" in found

    status, reply = cgd.request("GET", "/v1/components")
    lying = copy.deepcopy(reply["components"])
    lying[0]["replicas"][0]["cuda_visible_devices"] = "7,6"
    mark = {**os.environ, "CG_INSTANCE": str(cgd.state_dir.resolve())}
    stray = subprocess.Popen(["sleep", "600"], env=mark)
    released = subprocess.Popen(["sleep", "600"], env={**mark, "CG_COMPONENT": "gone", "CG_REPLICA": "0"})
    child = subprocess.Popen(["sleep", "600"], env={**mark, "CG_COMPONENT": "a", "CG_REPLICA": "0"})
    try:
        found = "\n".join(processes(cgd, load(cgd), lying))
    finally:
        for proc in (stray, released, child):
            proc.kill()
            proc.wait()
    assert f"pid {stray.pid}" in found and "no running replica owns it" in found
    assert f"pid {released.pid} (gone/0" in found, "what a released worker left is caught"
    assert f"pid {child.pid}" not in found, "a running replica's child is its own"
    assert "cgd says '7,6'" in found


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for `signum` (SigCgt in /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) >> (signum - 1) & 1)


def test_back_to_back_deaths_do_not_loop_promotions(cgd: Cgd) -> None:
    """The primary dies, then the shadow that took over dies while the old
    primary is just coming back as the new shadow: that fresh shadow must
    not be promoted (and killed by the signal) again and again."""
    for body in ({"name": "web", "claim": {"gpus": 1}}, {"name": "web-s", "shadow_of": "web"}):
        status, reply = cgd.request("POST", "/v1/components", {**body, "command": WORKER,
                                                               "restart": {"max_retries": 3, "backoff_s": 0.5}})
        assert status == 201, reply

    def replica(name: str) -> dict:
        return cgd.request("GET", f"/v1/components/{name}")[1]["replicas"][0]

    def ready(name: str) -> bool:
        # A promotion signal ends a worker that has not yet installed its handler.
        pids = replica(name)["pids"]
        return bool(pids) and catches(pids[0], signal.SIGUSR1)

    wait_for(lambda: ready("web") and ready("web-s"), "both workers handle SIGUSR1")
    first = replica("web")["pids"][0]
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not [p for p in replica("web")["pids"] if p != first] and time.monotonic() < deadline:
        time.sleep(0.002)
    os.kill(replica("web-s")["pids"][0], signal.SIGKILL)
    time.sleep(3.0)
    promotions = replica("web")["promotions"] + replica("web-s")["promotions"]
    assert promotions <= 5, f"{promotions} promotions in 3 s after two deaths"
