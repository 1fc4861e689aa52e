"""CPU-only components as cgctl shows them, against a real cgd on the simulated dgx-h100: what
`allocate` prints, the event it is told by, and where `status` names it."""

from __future__ import annotations

import sys

import pytest

from tests.cli.test_e2e import ok, wait_for
from tests.daemon_fixture import Cgd

pytestmark = pytest.mark.slow
CMD = ("--", sys.executable, "-c", "import time\nwhile True: time.sleep(3600)")


def test_a_cpu_only_component_says_its_cpus_and_shows_in_status(cgd: Cgd) -> None:
    out = ok(cgd, "allocate", "cpuonly", "--cpus", "4", *CMD)
    replica = out.splitlines()[1]
    assert "4 CPUs" in replica and "GPU" not in out and "CUDA_VISIBLE_DEVICES" not in out, out
    ok(cgd, "allocate", "web", "--gpus", "1", *CMD)
    events = [line.split(maxsplit=3)[3] for line in ok(cgd, "events").splitlines()]
    assert "cpuonly allocated 4 CPUs" in events and "web allocated on GPU 0" in events, events
    wait_for(lambda: "cpuonly:run" in ok(cgd, "status"))
    status = ok(cgd, "status").splitlines()
    assert "CPU only: 4 CPUs  cpuonly:run" in status, status
    assert all(len(line) <= 80 for line in status)
    long = ok(cgd, "status", "--long").splitlines()
    assert "CPU only: cpuonly:run (4 CPUs)" in long, long
    assert all(len(line) <= 80 for line in long)
