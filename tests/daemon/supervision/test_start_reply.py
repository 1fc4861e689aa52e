"""A start answers with the worker's own pid, not its launch shim's and not nothing."""

from __future__ import annotations

import json
from pathlib import Path

from tests.daemon_fixture import Cgd


def test_allocate_answers_with_the_worker_pid(cgd: Cgd) -> None:
    done = cgd.cgctl("--json", "allocate", "web", "--memory", "1GiB", "--", "sleep", "600")
    assert done.returncode == 0, done.stderr
    (pid,) = json.loads(done.stdout)["replicas"][0]["pids"]
    assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == b"sleep"
    assert b"CUDA_VISIBLE_DEVICES=" in Path(f"/proc/{pid}/environ").read_bytes()
