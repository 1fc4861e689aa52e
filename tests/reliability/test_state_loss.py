"""A fallback to an older state keeps the workers the lost generation started, and says so until acknowledged.

A real cgd starts a worker, is killed, and finds at its next start a
corrupt state file whose backup predates that worker: the worker must still
run (its owner never asked for it to end), and the loss must show in
`GET /v1/status`, `GET /v1/health` and `cgctl status` until an operator
acknowledges it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.daemon_fixture import Cgd, wait_for

pytestmark = pytest.mark.slow

SLEEP = ["sleep", "600"]


def running_pid(cgd: Cgd, name: str) -> int:
    def pid() -> int | None:
        status, reply = cgd.request("GET", f"/v1/components/{name}")
        pids = reply["replicas"][0]["pids"] if status == 200 else []
        return pids[0] if pids else None
    found = wait_for(pid, f"{name} running")
    assert found is not None
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_a_fallback_to_an_older_backup_keeps_and_reports_the_lost_generations_workers(cgd: Cgd) -> None:
    assert cgd.request("POST", "/v1/components", {"name": "kept", "claim": {"gpus": 1}, "command": SLEEP})[0] == 201
    kept = running_pid(cgd, "kept")
    older = cgd.state()  # the backup to fall back to: it knows "kept" only
    status, reply = cgd.request("POST", "/v1/components", {"name": "lost", "claim": {"gpus": 2}, "command": SLEEP})
    assert status == 201, reply
    lost = running_pid(cgd, "lost")
    cgd.kill9()
    cgd.write_state(older)
    os.replace(cgd.state_dir / "state.json", cgd.state_dir / "state.json.bak")
    (cgd.state_dir / "state.json").write_bytes(b"{ torn")
    cgd.start()

    assert "loaded its backup" in cgd.log()
    assert alive(lost) and alive(kept)
    _, status_doc = cgd.request("GET", "/v1/status")
    (loss,) = status_doc["state_loss"]
    assert loss["replica"] == "lost/0" and lost in loss["pids"] and loss["user"] == "root", loss
    assert loss["devices"], "the devices the worker was given are named"
    _, health = cgd.request("GET", "/v1/health")
    assert health["status"] == "degraded" and health["state_loss"] == status_doc["state_loss"]
    shown = cgd.cgctl("status")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("WARNING cgd's state lost a generation") and "lost/0 of root" in shown.stdout

    acked = cgd.cgctl("ack-state-loss")
    assert acked.returncode == 0 and "acknowledged: lost/0" in acked.stdout, (acked.stdout, acked.stderr)
    assert cgd.request("GET", "/v1/status")[1]["state_loss"] == []
    _, health = cgd.request("GET", "/v1/health")
    assert health["status"] == "ok" and health["state_loss"] == []
    assert "WARNING" not in cgd.cgctl("status").stdout
    assert alive(lost), "acknowledging touches no process"
    assert "no state loss to acknowledge" in cgd.cgctl("ack-state-loss").stdout


def test_the_gpus_a_lost_generations_worker_runs_on_are_not_handed_out_until_it_ends(cgd: Cgd) -> None:
    older = cgd.state()
    status, reply = cgd.request("POST", "/v1/components", {"name": "lost", "claim": {"gpus": 2}, "command": SLEEP})
    assert status == 201, reply
    lost = running_pid(cgd, "lost")
    cgd.kill9()
    cgd.write_state(older)
    cgd.start()
    shown = cgd.request("GET", "/v1/status")[1]
    (loss,) = shown["state_loss"]
    assert len(loss["gpus"]) == 2, loss
    held = {g["index"]: g["held_by_lost"] for g in shown["gpus"] if g["held_by_lost"]}
    assert held == {i: [{"replica": "lost/0", "user": loss["user"], "pids": loss["pids"]}] for i in loss["gpus"]}
    everything = {"name": "all", "claim": {"gpus": 8}, "command": SLEEP}
    status, reply = cgd.request("POST", "/v1/components", everything)
    assert status == 409, ("one GPU, two owners", reply)
    gpus = ",".join(map(str, loss["gpus"]))
    assert (f"held by lost/0 of {loss['user']}, kept from a lost generation of the state: GPUs {gpus}"
            in reply["error"]["message"]), reply
    assert cgd.cgctl("ack-state-loss").returncode == 0
    assert cgd.request("POST", "/v1/components", everything)[0] == 409, "acknowledging frees no GPU"
    shown_text = cgd.cgctl("status").stdout
    assert f"GPU {loss['gpus'][0]} HELD: held by lost/0 of {loss['user']} (lost state generation)" in shown_text, \
        shown_text
    os.kill(lost, 9)
    wait_for(lambda: cgd.request("POST", "/v1/components", everything)[0] == 201, "the GPUs back once it ended",
             timeout=30)
    assert not any(g["held_by_lost"] for g in cgd.request("GET", "/v1/status")[1]["gpus"])
