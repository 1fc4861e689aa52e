"""A deployment component's time limit holds on cgd as on Kubernetes: the instance ends `timeout`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.daemon.core.test_groups_e2e import ok
from tests.daemon_fixture import Cgd, wait_for

pytestmark = pytest.mark.slow


def test_a_component_past_its_time_limit_is_stopped_and_not_restarted(cgd: Cgd, tmp_path: Path) -> None:
    path = tmp_path / "limited.toml"
    sleeper = f'command = [{json.dumps(sys.executable)}, "-c", "import time; time.sleep(3600)"]\n'
    path.write_text(
        'name = "limited"\n\n[[claims]]\nname = "one"\ngpus = 1\n\n'
        f'[[components]]\nname = "w"\n{sleeper}'
        'time_limit_s = 1\nsharing = [{ claim = "one", scope = "per-replica" }]\n\n'
        f'[[components]]\nname = "free"\n{sleeper}')
    ok(cgd, "apply", "-f", str(path))

    def state(name: str) -> str:
        status, reply = cgd.request("GET", f"/v1/components/{name}")
        assert status == 200, reply
        return str(reply["state"])

    wait_for(lambda: state("limited-0-w") == "timeout", "the limited instance timed out", timeout=20)
    assert not cgd.request("GET", "/v1/components/limited-0-w")[1]["replicas"][0]["pids"]
    assert state("limited-0-free") == "running", "a component without a limit runs on"
