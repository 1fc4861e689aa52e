"""A start of cgd that fails once its supervisor runs leaves the workers for the next cgd.

The listeners are bound before any worker is touched (daemon/lifecycle.py),
so what can still fail after the supervisor has started is the take-over
of the previous run's workers: its first step makes the state it read
durable, and the disk can refuse that fsync. Here it does (the gate of
tests/fsync_gate), on a cgd started after a kill -9 left its workers
running. That cgd must end with one clear line and a non-zero status,
leave the workers running, and the next cgd adopt them as they are.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.daemon_fixture import Cgd, ended, wait_for
from tests.fsync_gate import FsyncGate

pytestmark = pytest.mark.slow

SLEEP = ["sleep", "3600"]


def pids_of(cgd: Cgd, name: str) -> list[int]:
    return wait_for(lambda: cgd.request("GET", f"/v1/components/{name}")[1]["replicas"][0]["pids"],
                    f"{name} runs")


def test_a_start_that_fails_after_the_supervisor_runs_keeps_the_workers_for_the_next_cgd(
        start_cgd: Callable[..., Cgd], tmp_path: Path) -> None:
    gate = FsyncGate(tmp_path / "gate")
    cgd = start_cgd("dgx-h100", env=gate.env())
    for name in ("a", "b"):
        assert cgd.request("POST", "/v1/components", {"name": name, "claim": {"gpus": 1}, "command": SLEEP})[0] == 201
    (a,), (b,) = pids_of(cgd, "a"), pids_of(cgd, "b")
    before = cgd.state()
    cgd.kill9()
    os.kill(b, signal.SIGKILL)  # died while no cgd ran: the next good start runs it again
    wait_for(lambda: ended(b), "b ended")

    gate.fail()
    with pytest.raises(RuntimeError, match="cgd exited with 3"):
        cgd.start()
    errors = [line for line in cgd.log().splitlines() if line.startswith("cgd: error:")]
    assert len(errors) == 1 and "cannot take over the previous run's workers" in errors[0], cgd.log()
    assert "Input/output error" in errors[0] and "Traceback" not in cgd.log()
    assert not ended(a), "the failed start kept a running"
    assert not cgd.socket.exists(), "nothing is left listening"

    gate.heal()
    cgd.start()
    assert pids_of(cgd, "a") == [a], "adopted, not restarted"
    assert pids_of(cgd, "b") != [b], "started again"
    after = cgd.state()
    assert after["components"].keys() == before["components"].keys() == {"a", "b"}
    assert after["groups"] == before["groups"], "every group kept as it was"
    assert after["workers"]["a/0"]["pid"] == before["workers"]["a/0"]["pid"], "the same launch shim"
