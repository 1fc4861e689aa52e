"""Jobs on a real cgd: restart policies, completion, time limits, the wait queue and backfill.

Driven over the socket as a client would; what runs is checked in the
workers' own output and in what the next claim is given.
"""

from __future__ import annotations

import functools
import getpass
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_fixture import Cgd, wait_for

pytestmark = pytest.mark.slow


def allocate(cgd: Cgd, body: dict[str, Any], expect: int = 201) -> dict[str, Any]:
    status, reply = cgd.request("POST", "/v1/components", body)
    assert status == expect, (status, reply, cgd.log())
    return reply


def ended(cgd: Cgd, name: str, timeout: float = 20.0) -> dict[str, Any]:
    status, reply = cgd.request("GET", f"/v1/components/{name}/wait?until=ended&timeout={timeout:g}",
                                timeout=timeout + 5)
    assert status == 200 and reply["reached"], (status, reply, cgd.log())
    return reply["component"]


def component(cgd: Cgd, name: str) -> dict[str, Any]:
    status, reply = cgd.request("GET", f"/v1/components/{name}")
    assert status == 200, (status, reply)
    return reply


def runs(log: Path) -> int:
    return log.read_text().count("run\n") if log.exists() else 0


def runs_are(log: Path, count: int) -> bool:
    return runs(log) == count


def test_a_job_that_exits_0_runs_once_and_frees_its_gpus(cgd: Cgd) -> None:
    allocate(cgd, {"name": "once", "claim": {"gpus": 8}, "command": ["sh", "-c", "echo run; exit 0"]})
    job = ended(cgd, "once")
    assert job["state"] == "completed" and job["exit_code"] == 0 and job["restart"] == "on-failure"
    assert job["replicas"][0]["state"] == "completed" and job["replicas"][0]["groups"] == []
    assert job["duration_s"] is not None and job["ended_at"] >= job["created"]
    assert runs(cgd.log_dir / "once" / "0.out") == 1
    allocate(cgd, {"name": "next", "claim": {"gpus": 8}})  # all 8 GPUs are free again
    _, listed = cgd.request("GET", "/v1/components")
    assert {c["name"]: c["state"] for c in listed["components"]} == {"once": "completed", "next": "allocated"}


def test_on_failure_retries_then_fails_with_the_exit_code(cgd: Cgd) -> None:
    allocate(cgd, {"name": "crash", "claim": {"gpus": 1}, "command": ["sh", "-c", "echo run; exit 3"],
                   "restart": {"max_retries": 2, "backoff_s": 0}})
    job = ended(cgd, "crash")
    assert job["state"] == "failed" and job["exit_code"] == 3
    assert job["replicas"][0]["restarts"] == 2 and runs(cgd.log_dir / "crash" / "0.out") == 3


def test_never_runs_once_even_when_it_fails(cgd: Cgd) -> None:
    allocate(cgd, {"name": "one-shot", "claim": {"gpus": 1}, "command": ["sh", "-c", "echo run; kill -9 $$"],
                   "restart": {"policy": "never"}})
    job = ended(cgd, "one-shot")
    assert job["state"] == "failed" and job["exit_code"] == 128 + 9
    assert runs(cgd.log_dir / "one-shot" / "0.out") == 1


def test_always_restarts_a_worker_that_exits_0(cgd: Cgd) -> None:
    allocate(cgd, {"name": "service", "claim": {"gpus": 1}, "command": ["sh", "-c", "echo run; exit 0"],
                   "restart": {"policy": "always", "max_retries": 100, "backoff_s": 0}})
    wait_for(lambda: runs(cgd.log_dir / "service" / "0.out") >= 3, "three runs")
    assert component(cgd, "service")["state"] in ("running", "restarting")


def test_a_job_past_its_time_limit_is_stopped_and_marked_timeout(cgd: Cgd) -> None:
    allocate(cgd, {"name": "slow", "claim": {"gpus": 8}, "command": ["sleep", "60"], "time_limit_s": 0.5})
    job = ended(cgd, "slow")
    assert job["state"] == "timeout" and job["exit_code"] == 124
    assert job["replicas"][0]["pids"] == []
    allocate(cgd, {"name": "next", "claim": {"gpus": 8}})


def test_a_finished_name_can_be_reused(cgd: Cgd) -> None:
    allocate(cgd, {"name": "job", "claim": {"gpus": 1}, "command": ["true"]})
    ended(cgd, "job")
    allocate(cgd, {"name": "job", "claim": {"gpus": 2}, "command": ["sh", "-c", "exit 5"],
                   "restart": {"policy": "never"}})
    assert ended(cgd, "job")["exit_code"] == 5


def test_two_whole_box_jobs_queue_and_run_one_after_the_other(cgd: Cgd, tmp_path: Path) -> None:
    go = tmp_path / "go"
    first = ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done; echo run"]
    allocate(cgd, {"name": "first", "claim": {"gpus": 8}, "command": first, "wait": True})
    queued = allocate(cgd, {"name": "second", "claim": {"gpus": 8}, "command": ["sh", "-c", "echo run"],
                            "wait": True, "detach": True})
    assert queued["state"] == "pending" and queued["queue"]["position"] == 1
    assert "does not fit" in queued["queue"]["reason"] or "GPU" in queued["queue"]["reason"]
    status, refused = cgd.request("POST", "/v1/components", {"name": "third", "claim": {"gpus": 8}})
    assert status == 409 and "queued" in refused["error"]["message"], refused  # no jumping the queue
    go.touch()
    assert ended(cgd, "first")["state"] == "completed"
    second = ended(cgd, "second")
    assert second["state"] == "completed" and runs(cgd.log_dir / "second" / "0.out") == 1


def test_a_claim_that_can_never_fit_is_refused_even_with_wait(cgd: Cgd) -> None:
    status, reply = cgd.request("POST", "/v1/components", {"name": "huge", "claim": {"gpus": 9}, "wait": True})
    assert status == 422 and "8" in reply["error"]["message"], reply
    assert cgd.request("GET", "/v1/components/huge")[0] == 404


def test_a_queued_claim_survives_kill_9_and_still_starts(start_cgd, tmp_path: Path) -> None:
    cgd = start_cgd("dgx-h100")
    go = tmp_path / "go"
    allocate(cgd, {"name": "first", "claim": {"gpus": 8},
                   "command": ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done"]})
    allocate(cgd, {"name": "second", "claim": {"gpus": 8}, "command": ["sh", "-c", "echo run"],
                   "wait": True, "detach": True})
    cgd.kill9()
    cgd.start()
    assert component(cgd, "second")["state"] == "pending"
    go.touch()
    assert ended(cgd, "second")["state"] == "completed"


def test_backfill_only_what_ends_before_the_head_can_start(cgd: Cgd, tmp_path: Path) -> None:
    go = tmp_path / "go"
    hold = ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done"]
    allocate(cgd, {"name": "big", "claim": {"gpus": 6}, "command": hold, "time_limit_s": 30})
    head = allocate(cgd, {"name": "head", "claim": {"gpus": 8}, "command": ["true"], "wait": True, "detach": True})
    assert head["state"] == "pending"
    short = allocate(cgd, {"name": "short", "claim": {"gpus": 1}, "command": ["sleep", "0.2"],
                           "time_limit_s": 5, "wait": True, "detach": True})
    assert short["state"] != "pending"  # ends (by its limit) before big's limit lets the head start
    endless = allocate(cgd, {"name": "endless", "claim": {"gpus": 1}, "command": ["sleep", "0.2"],
                             "wait": True, "detach": True})
    assert endless["state"] == "pending" and endless["queue"]["position"] == 2
    too_long = allocate(cgd, {"name": "too-long", "claim": {"gpus": 1}, "command": ["sleep", "0.2"],
                              "time_limit_s": 60, "wait": True, "detach": True})
    assert too_long["state"] == "pending"
    go.touch()
    for name in ("big", "short", "head", "endless", "too-long"):
        assert ended(cgd, name)["state"] == "completed", name


def test_a_waiting_claim_whose_client_is_gone_is_dropped(start_cgd, tmp_path: Path) -> None:
    config = tmp_path / "cgd.toml"
    config.write_text("[health]\ninterval_s = 0.1\n")
    cgd = start_cgd("dgx-h100", "--config", str(config))
    allocate(cgd, {"name": "first", "claim": {"gpus": 8}, "command": ["sleep", "60"]})
    client = (
        "import http.client, json, socket, sys\n"
        "class C(http.client.HTTPConnection):\n"
        "    def connect(self):\n"
        "        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect(sys.argv[1])\n"
        "c = C('cgd'); c.request('POST', '/v1/components', json.dumps("
        "{'name': 'waiter', 'claim': {'gpus': 8}, 'wait': True}), {'Content-Type': 'application/json'})\n"
        "print(json.loads(c.getresponse().read())['state'])\n"
    )
    out = subprocess.run([sys.executable, "-c", client, str(cgd.socket)], capture_output=True, text=True,
                         timeout=20)
    assert out.stdout.strip() == "pending", out
    wait_for(lambda: cgd.request("GET", "/v1/components/waiter")[0] == 404, "the waiter's claim dropped")


def test_ended_jobs_are_forgotten_after_the_retention(start_cgd, tmp_path: Path) -> None:
    config = tmp_path / "cgd.toml"
    config.write_text("[health]\ninterval_s = 0.1\n\n[jobs]\nretention_s = 0.5\n")
    cgd = start_cgd("dgx-h100", "--config", str(config))
    allocate(cgd, {"name": "brief", "claim": {"gpus": 1}, "command": ["true"]})
    ended(cgd, "brief")
    wait_for(lambda: cgd.request("GET", "/v1/components/brief")[0] == 404, "the ended job forgotten")


def test_after_a_reboot_jobs_start_again_by_their_policy(start_cgd) -> None:
    cgd = start_cgd("dgx-h100")
    for name, policy in (("service", "always"), ("job", "on-failure"), ("once", "never")):
        allocate(cgd, {"name": name, "claim": {"gpus": 1}, "command": ["sh", "-c", "echo run; sleep 60"],
                       "restart": {"policy": policy}})
        wait_for(functools.partial(runs_are, cgd.log_dir / name / "0.out", 1), f"{name} running")
    cgd.kill9()
    for pid in cgd.worker_pids():  # the box went down: nothing of the last boot runs
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not cgd.worker_pids(), "the workers gone")
    cgd.start()
    assert ended(cgd, "once")["state"] == "failed"
    for name, restarts in (("service", 0), ("job", 1)):
        wait_for(functools.partial(runs_are, cgd.log_dir / name / "0.out", 2), f"{name} started again")
        replica = component(cgd, name)["replicas"][0]
        assert replica["state"] == "running" and replica["restarts"] == restarts, replica


def test_no_path_that_takes_capacity_jumps_the_queue(cgd: Cgd, tmp_path: Path) -> None:
    """A reservation, a group, a scale-out and a deployment wait behind a queued head as allocate does;
    a higher priority goes first, and the head's reason follows what is free."""
    allocate(cgd, {"name": "small", "claim": {"gpus": 1}})
    allocate(cgd, {"name": "holder", "claim": {"gpus": 5}})
    head = allocate(cgd, {"name": "head", "claim": {"gpus": 8}, "wait": True, "detach": True})
    assert head["state"] == "pending" and "2 free" in head["queue"]["reason"], head
    behind = allocate(cgd, {"name": "behind", "claim": {"gpus": 1}, "wait": True, "detach": True})
    assert behind["state"] == "pending"
    for method, path, body in (
        ("POST", "/v1/reservations", {"name": "r", "claim": {"gpus": 1}}),
        ("POST", "/v1/groups", {"claim": {"gpus": 1}}),
        ("POST", "/v1/components/small/scale", {"replicas": 2}),
    ):
        status, reply = cgd.request(method, path, body)
        message = reply["error"]["message"]
        assert status == 409 and message.startswith("does not fit now: ") and "'head'" in message, (path, reply)
    deployment = tmp_path / "svc.toml"
    deployment.write_text('name = "svc"\n\n[[claims]]\nname = "one"\ngpus = 1\n\n'
                          '[[components]]\nname = "c"\nsharing = [{claim = "one", scope = "per-replica"}]\n')
    done = cgd.cgctl("apply", "-f", str(deployment))
    assert done.returncode == 1 and "'head'" in done.stderr, done
    state = cgd.state()
    assert set(state["groups"]) == {"small-0", "holder-0"} and not state["reservations"], state["groups"]
    status, reply = cgd.request("POST", "/v1/reservations", {"name": "urgent", "claim": {"gpus": 1, "priority": 5}})
    assert status == 201, reply  # a higher priority is not behind the head
    wait_for(lambda: "1 free" in (component(cgd, "head")["queue"]["reason"] or ""), "the head's reason told again")
    reason = component(cgd, "behind")["queue"]["reason"]
    assert reason == (f"waits behind 'head' of {getpass.getuser()}, the first in the queue: a claim without "
                      "a time limit never goes around it"), reason


def test_an_adopted_job_that_exits_0_is_completed_and_runs_once(start_cgd, tmp_path: Path) -> None:
    """cgd is not an adopted worker's parent; its launch shim is, and writes how it ended."""
    cgd = start_cgd("dgx-h100")
    go = tmp_path / "go"
    job = ["sh", "-c", f"echo run; while [ ! -e {go} ]; do sleep 0.02; done; exit 0"]
    for name, policy in (("once", "never"), ("job", "on-failure")):
        allocate(cgd, {"name": name, "claim": {"gpus": 1}, "command": job, "restart": {"policy": policy}})
        wait_for(functools.partial(runs_are, cgd.log_dir / name / "0.out", 1), f"{name} running")
    cgd.kill9()
    cgd.start()
    assert component(cgd, "once")["replicas"][0]["state"] == "adopted"
    go.touch()
    for name in ("once", "job"):
        job_doc = ended(cgd, name)
        assert job_doc["state"] == "completed" and job_doc["exit_code"] == 0, job_doc
        assert runs(cgd.log_dir / name / "0.out") == 1, name
    done = cgd.cgctl("wait", "once")
    assert done.returncode == 0, done


def test_retries_still_count_after_a_restart_of_cgd(start_cgd, tmp_path: Path) -> None:
    """max_retries 1: one failure before cgd is killed, one after, and no third run."""
    cgd = start_cgd("dgx-h100")
    go = tmp_path / "go"
    flaky = ["sh", "-c", f"echo run; if [ -e {tmp_path / 'first'} ]; then "
                         f"while [ ! -e {go} ]; do sleep 0.02; done; fi; touch {tmp_path / 'first'}; exit 3"]
    allocate(cgd, {"name": "flaky", "claim": {"gpus": 1}, "command": flaky,
                   "restart": {"max_retries": 1, "backoff_s": 0}})
    wait_for(functools.partial(runs_are, cgd.log_dir / "flaky" / "0.out", 2), "the retry running")
    cgd.kill9()
    cgd.start()
    go.touch()
    job = ended(cgd, "flaky")
    assert job["state"] == "failed" and job["exit_code"] == 3, job
    assert runs(cgd.log_dir / "flaky" / "0.out") == 2


def test_a_refusal_names_the_people_and_what_holds_the_gpus(cgd: Cgd, tmp_path: Path) -> None:
    allocate(cgd, {"name": "train", "claim": {"gpus": 4}})
    assert cgd.request("POST", "/v1/reservations", {"name": "later", "claim": {"gpus": 1}})[0] == 201
    assert cgd.request("POST", "/v1/groups", {"claim": {"gpus": 1}})[0] == 201
    deployment = tmp_path / "svc.toml"
    deployment.write_text('name = "svc"\n\n[[claims]]\nname = "one"\ngpus = 1\n\n'
                          '[[components]]\nname = "c"\nsharing = [{claim = "one", scope = "per-replica"}]\n')
    assert cgd.cgctl("apply", "-f", str(deployment)).returncode == 0
    status, reply = cgd.request("POST", "/v1/components", {"name": "big", "claim": {"gpus": 8}})
    message = reply["error"]["message"]
    assert status == 409 and message.startswith("needs 8 whole GPUs; 1 free"), message
    for holder in ("in use by root (component train): GPUs 0-3", "in use by root (reservation later): GPU",
                   "in use by root (group group.1): GPU", "in use by root (deployment svc): GPU"):
        assert holder in message, message
    queued = allocate(cgd, {"name": "big", "claim": {"gpus": 8}, "wait": True, "detach": True})
    assert "in use by root (component train)" in queued["queue"]["reason"], queued


def test_a_job_that_ended_while_cgd_was_down_is_judged_by_its_status(start_cgd, tmp_path: Path) -> None:
    """Its launch shim wrote how it ended: exit 0 completes it (no second run), a failure under
    `never` is failed with its code."""
    cgd = start_cgd("dgx-h100")
    go = tmp_path / "go"
    for name, policy, code in (("ok", "on-failure", 0), ("bad", "never", 3)):
        allocate(cgd, {"name": name, "claim": {"gpus": 1}, "restart": {"policy": policy},
                       "command": ["sh", "-c", f"echo run; while [ ! -e {go} ]; do sleep 0.02; done; exit {code}"]})
        wait_for(functools.partial(runs_are, cgd.log_dir / name / "0.out", 1), f"{name} running")
    cgd.kill9()
    go.touch()
    wait_for(lambda: not cgd.worker_pids(), "both ended while cgd was down")
    cgd.start()
    assert (ended(cgd, "ok")["state"], ended(cgd, "ok")["exit_code"]) == ("completed", 0)
    assert (ended(cgd, "bad")["state"], ended(cgd, "bad")["exit_code"]) == ("failed", 3)
    assert runs(cgd.log_dir / "ok" / "0.out") == 1 and runs(cgd.log_dir / "bad" / "0.out") == 1
