"""A start answers with the worker's own pid, not its launch shim's and not nothing."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

from tests.daemon_fixture import Cgd, wait_for


def test_allocate_answers_with_the_worker_pid(cgd: Cgd) -> None:
    done = cgd.cgctl("--json", "allocate", "web", "--memory", "1GiB", "--", "sleep", "600")
    assert done.returncode == 0, done.stderr
    (pid,) = json.loads(done.stdout)["replicas"][0]["pids"]
    assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == b"sleep"
    assert b"CUDA_VISIBLE_DEVICES=" in Path(f"/proc/{pid}/environ").read_bytes()


def test_a_queued_allocation_answers_with_the_worker_pid_once_placed(cgd: Cgd) -> None:
    """`allocate --wait` waits for its turn; placed, it answers as a direct allocation does: the
    worker runs and its pid is known, not `running` with no pid."""
    status, reply = cgd.request("POST", "/v1/components", {"name": "holder", "claim": {"gpus": 8}})
    assert status == 201, reply
    done: list[subprocess.CompletedProcess[str]] = []
    waiting = threading.Thread(target=lambda: done.append(cgd.cgctl(
        "--json", "allocate", "web", "--gpus", "1", "--wait", "--", "sleep", "600", timeout=60)))
    waiting.start()
    wait_for(lambda: cgd.request("GET", "/v1/components/web")[0] == 200, "web queued")
    assert cgd.request("DELETE", "/v1/components/holder")[0] == 200
    waiting.join(timeout=60)
    assert done and done[0].returncode == 0, done
    (pid,) = json.loads(done[0].stdout)["replicas"][0]["pids"]
    assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == b"sleep"
