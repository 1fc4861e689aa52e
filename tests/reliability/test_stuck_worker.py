"""A worker stuck in the kernel outlives SIGKILL: its release fails naming it, and its GPUs stay held.

A process in uninterruptible sleep (a hung driver call, on a GPU box) cannot
be killed until the kernel lets go of it. The cgroup v1 freezer makes one for
real: a frozen task that gets SIGKILL stays in state D until it is thawed.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_fixture import Cgd, wait_for

pytestmark = pytest.mark.slow

FREEZER = Path("/sys/fs/cgroup/freezer")


def freezer_unusable() -> str | None:
    if not (FREEZER / "cgroup.procs").exists():
        return "no cgroup v1 freezer is mounted at /sys/fs/cgroup/freezer"
    if not os.access(FREEZER, os.W_OK):
        return "the cgroup v1 freezer is not writable here"
    return None


@pytest.fixture
def freezer() -> Iterator[Path]:
    directory = FREEZER / f"cg-test-{uuid.uuid4().hex[:8]}"
    directory.mkdir()
    try:
        yield directory
    finally:
        (directory / "freezer.state").write_text("THAWED")
        wait_for(lambda: not (directory / "cgroup.procs").read_text().split(), "the frozen tasks ended")
        directory.rmdir()


@pytest.mark.skipif(freezer_unusable() is not None, reason=str(freezer_unusable()))
def test_a_release_never_frees_the_gpus_of_a_worker_that_survives_sigkill(cgd: Cgd, freezer: Path) -> None:
    body = {"name": "stuck", "claim": {"gpus": 8}, "stop_timeout_s": 0.2,
            "command": [sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"]}
    status, reply = cgd.request("POST", "/v1/components", body)
    assert status == 201, reply
    pid = wait_for(lambda: cgd.request("GET", "/v1/components/stuck")[1]["replicas"][0]["pids"], "it runs")[0]
    (freezer / "cgroup.procs").write_text(str(pid))
    (freezer / "freezer.state").write_text("FROZEN")
    wait_for(lambda: (freezer / "freezer.state").read_text().strip() == "FROZEN", "the worker frozen")

    status, reply = cgd.request("DELETE", "/v1/components/stuck", timeout=30)
    assert status == 409 and reply["error"]["code"] == "still_running", reply
    named = reply["error"]["message"].split("stuck/0: pids ", 1)[1].split(";")[0]
    assert str(pid) in named.split(", "), reply  # with its launch shim, which waits for it
    assert Path(f"/proc/{pid}").exists()
    other = {"name": "other", "claim": {"gpus": 1}, "command": ["sleep", "60"]}
    status, reply = cgd.request("POST", "/v1/components", other)
    assert status == 409, ("the stuck worker's GPUs went to someone else", reply)
    status, reply = cgd.request("GET", "/v1/components/stuck")
    assert status == 200 and reply["state"] == "releasing", reply

    (freezer / "freezer.state").write_text("THAWED")  # the kernel lets go: SIGKILL takes effect
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text(),
             "the worker died once thawed")
    status, reply = cgd.request("DELETE", "/v1/components/stuck", timeout=30)
    assert status == 200, reply
    assert cgd.request("POST", "/v1/components", other)[0] == 201
