"""What NVML measures, beside what is allocated: a real cgd whose simulated GPUs list its workers."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_fixture import Cgd, wait_for

pytestmark = pytest.mark.slow

SLEEPER = [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"]


def fast_health(tmp_path: Path) -> str:
    config = tmp_path / "cgd.toml"
    config.write_text("[health]\ninterval_s = 0.2\n")
    return str(config)


def gpus(cgd: Cgd) -> list[dict[str, Any]]:
    status, reply = cgd.request("GET", "/v1/status")
    assert status == 200, reply
    return reply["gpus"]


def test_status_shows_measured_use_per_gpu_and_per_component(start_cgd, tmp_path: Path) -> None:
    cgd = start_cgd("dgx-h100", "--config", fast_health(tmp_path))
    cgd.faults_file.write_text(json.dumps({
        "worker_memory_mib": {"0": 3000, "1": 1500},
        "worker_utilization_pct": {"0": 40, "1": 25},
        "memory_utilization": {"1": 7},
        "temperature": {"0": 61},
    }))
    for name, gpu in (("train", 0), ("serve", 1)):
        status, reply = cgd.request("POST", "/v1/components", {
            "name": name, "command": SLEEPER, "claim": {"gpus": 1, "gpu_ids": [gpu]}})
        assert status == 201, reply
    status, reply = cgd.request("POST", "/v1/components", {
        "name": "side", "command": SLEEPER, "share_with": "serve"})
    assert status == 201, reply

    def measured() -> list[dict[str, Any]]:
        now = gpus(cgd)
        mine = [c for g in now[:2] for c in g["components"]]
        return now if all(c["memory_used_mib"] for c in mine) and len(mine) == 3 else []

    now = wait_for(measured, "both GPUs measured with the workers on them")
    g0, g1, g2 = now[0], now[1], now[2]
    assert g0["measured"]["memory_used_mib"] == 3000
    assert g0["measured"]["utilization_gpu_pct"] == 40 and g0["measured"]["utilization_memory_pct"] == 40
    assert g0["measured"]["temperature_c"] == 61
    assert g0["memory_allocated_mib"] == g0["memory_mib"], "allocated stays what the state holds"
    assert g1["measured"]["memory_used_mib"] == 3000, "two workers of 1500 MiB share GPU 1"
    assert g1["measured"]["utilization_gpu_pct"] == 50 and g1["measured"]["utilization_memory_pct"] == 7
    assert isinstance(g0["measured"]["sampled_at"], float)
    [train] = g0["components"]
    assert train["name"] == "train" and train["memory_used_mib"] == 3000 and train["state"] == "running"
    assert train["reservation"] is False and train["user"]
    by_name = {c["name"]: c for c in g1["components"]}
    assert by_name["serve"]["memory_used_mib"] == 1500 and by_name["side"]["memory_used_mib"] == 1500
    assert g2["measured"]["memory_used_mib"] == 0 and g2["measured"]["utilization_gpu_pct"] == 0
    assert g2["components"] == []
    assert g0["foreign_processes"] == [], "cgd's own workers are not foreign"

    # A GPU that stops answering is measured as unknown; its components' use too.
    cgd.faults_file.write_text(json.dumps({"lost": [0], "worker_memory_mib": {"0": 3000}}))
    def lost() -> dict[str, Any]:
        g = gpus(cgd)[0]
        return g if g["measured"]["memory_used_mib"] is None else {}

    g0 = wait_for(lost, "GPU 0 lost")
    assert g0["components"][0]["memory_used_mib"] is None


def test_a_reservation_is_listed_with_unknown_use(cgd: Cgd) -> None:
    """A reservation runs no worker: what it uses is unknown, not zero."""
    status, reply = cgd.request("POST", "/v1/reservations", {"name": "later", "claim": {"gpus": 1, "gpu_ids": [4]},
                                                             "ttl_s": 600})
    assert status == 201, reply
    [entry] = gpus(cgd)[4]["components"]
    assert entry == {"name": "later", "user": entry["user"], "state": "reserved",
                     "reservation": True, "shadow_of": None, "memory_used_mib": None}
    assert entry["user"]
