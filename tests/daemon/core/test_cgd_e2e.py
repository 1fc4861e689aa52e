"""A real cgd on simulated machines, driven over its socket, real workers checked in /proc."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import psutil
import pytest

from tests.daemon_fixture import Cgd, ended

pytestmark = pytest.mark.slow

# A worker that sleeps, and on SIGUSR1 notes the role its role file now says.
WORKER = (
    "import os, signal, sys, time\n"
    "def promoted(*_):\n"
    "    with open(os.environ['CG_ROLE_FILE']) as f: role = f.read().strip()\n"
    "    print('promoted to', role, flush=True)\n"
    "signal.signal(signal.SIGUSR1, promoted)\n"
    "print('started', os.environ.get('CG_ROLE'), os.environ.get('CUDA_VISIBLE_DEVICES'), flush=True)\n"
    "while True: time.sleep(0.05)\n"
)


def worker_cmd() -> list[str]:
    return [sys.executable, "-c", WORKER]


def proc_env(pid: int) -> dict[str, str]:
    """The worker's environment once the launch shim has exec'd into it."""
    def read() -> dict[str, str] | None:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        env = dict(item.decode().split("=", 1) for item in raw.split(b"\0") if b"=" in item)
        return env if "CG_COMPONENT" in env else None
    return wait_for(read)


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def allocate(cgd: Cgd, body: dict, expect: int = 201) -> dict:
    status, reply = cgd.request("POST", "/v1/components", body)
    assert status == expect, (status, reply, cgd.log())
    return reply


def state_file(cgd: Cgd) -> dict:
    return cgd.state()


def web_with_shadow(cgd: Cgd, claim: dict | None = None, promotable: bool = True) -> tuple[int, int, Path]:
    """Component `web` and its shadow `web-standby`, both serving: (primary pid, shadow pid, shadow's log).

    `promotable` waits until cgd would promote the shadow: its signal handler
    is in place and it has run for a second (computegroups.daemon.core.events.PROMOTION_MIN_UPTIME_S).
    """
    allocate(cgd, {"name": "web", "claim": claim or {"gpus": 1}, "command": worker_cmd()})
    allocate(cgd, {"name": "web-standby", "shadow_of": "web", "command": worker_cmd()})
    primary = wait_for(lambda: cgd.request("GET", "/v1/components/web")[1]["replicas"][0]["pids"])[0]
    shadow = wait_for(lambda: cgd.request("GET", "/v1/components/web-standby")[1]["replicas"][0]["pids"])[0]
    shadow_log = cgd.log_dir / "web-standby" / "0.out"
    wait_for(lambda: shadow_log.exists() and "started shadow" in shadow_log.read_text())
    if promotable:
        wait_for(lambda: time.time() - psutil.Process(shadow).create_time() >= 1.1)
    return primary, shadow, shadow_log


def test_whole_gpus_worker_env_and_release(cgd: Cgd) -> None:
    comp = allocate(cgd, {"name": "trainer", "claim": {"gpus": 4, "colocate": "nvlink"},
                          "command": worker_cmd(), "env": {"MODEL": "llama"}})
    replica = comp["replicas"][0]
    assert len(replica["devices"]) == 4
    pid = wait_for(lambda: cgd.request("GET", "/v1/components/trainer")[1]["replicas"][0]["pids"])[0]
    env = proc_env(pid)
    indices = sorted(d["index"] for d in replica["devices"])
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, indices))
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["CG_COMPONENT"] == "trainer" and env["CG_REPLICA"] == "0" and env["CG_ROLE"] == "primary"
    assert env["MODEL"] == "llama"
    assert "CG_SOCKET" not in env, "workers get a clean environment, not cgd's"
    assert psutil.Process(pid).uids().real == os.getuid()
    log_file = wait_for(lambda: [p for p in cgd.log_dir.rglob("*") if p.is_file() and p.stat().st_size])
    assert any("started primary" in p.read_text() for p in log_file)

    status, reply = cgd.request("DELETE", "/v1/components/trainer")
    assert status == 200 and reply["released"] == ["trainer"]
    assert ended(pid)
    assert state_file(cgd)["groups"] == {}


def test_fractional_shares_pack_and_exhaust(cgd: Cgd) -> None:
    for name in ("a", "b", "c"):
        allocate(cgd, {"name": name, "claim": {"memory_mib": 20480}})
    gpus = {d["index"] for n in "abc"
            for d in cgd.request("GET", f"/v1/components/{n}")[1]["replicas"][0]["devices"]}
    assert len(gpus) == 1, "binpack puts three 20 GiB shares on one 80 GiB GPU"
    status, reply = cgd.request("POST", "/v1/components", {"name": "huge", "claim": {"gpus": 9}})
    assert status == 422 and reply["error"]["code"] == "unsatisfiable"
    allocate(cgd, {"name": "eight", "claim": {"gpus": 7}})
    status, reply = cgd.request("POST", "/v1/components", {"name": "one-more", "claim": {"gpus": 1}})
    assert status == 409 and reply["error"]["code"] == "insufficient_capacity", reply


def test_bad_requests_change_nothing_and_daemon_survives(cgd: Cgd) -> None:
    allocate(cgd, {"name": "keep", "claim": {"gpus": 1}})
    before = state_file(cgd)
    bad = [
        ("POST", "/v1/components", b"\x00\xff garbage"),
        ("POST", "/v1/components", b'{"name": "x", "claim": {"gpus": "two"}}'),
        ("POST", "/v1/components", b'{"name": "x", "claim": {"gpus": 1}, "colour": "red"}'),
        ("POST", "/v1/components", b'{"name": "../etc", "claim": {"gpus": 1}}'),
        ("POST", "/v1/components", b'{"name": "a/b", "claim": {"gpus": 1}}'),
        ("POST", "/v1/components", b"[" * 10000 + b"]" * 10000),
        ("POST", "/v1/components", b'{"name": "x", "claim": {"gpus": 1}, "env": {"CUDA_VISIBLE_DEVICES": "0"}}'),
        ("POST", "/v1/components/keep/scale", b'{"replicas": -1}'),
        ("DELETE", "/v1/components/..", None),
        ("GET", "/v1/nothing-here", None),
        ("PUT", "/v1/components", b"{}"),
    ]
    for method, path, raw in bad:
        status, reply = cgd.request(method, path, raw=raw)
        assert 400 <= status < 500, (method, path, status, reply)
        assert set(reply["error"]) == {"code", "message"}
    status, reply = cgd.request("POST", "/v1/components", raw=b"{" + b" " * (2 * 1024 * 1024) + b"}")
    assert status == 413
    # A truncated HTTP request and a connection closed mid-body.
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(cgd.socket))
        s.sendall(b"POST /v1/components HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"na")
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(cgd.socket))
        s.sendall(b"GARBAGE\r\n\r\n")
    assert state_file(cgd) == before
    assert cgd.request("GET", "/v1/version")[0] == 200


def test_second_daemon_on_same_state_is_refused(start_cgd, cgd: Cgd) -> None:
    second = subprocess.run(
        [*cgd.command()[:-6], "--socket", str(cgd.root / "other.sock"),
         "--state-dir", str(cgd.state_dir), "--log-dir", str(cgd.log_dir)],
        env=cgd.env(), capture_output=True, text=True, timeout=30,
    )
    assert second.returncode != 0
    assert f"cgd already runs as pid {cgd.pid} for {cgd.state_dir}" in second.stderr
    modes = {p.name: p.stat().st_mode & 0o777 for p in cgd.state_dir.iterdir() if p.is_file()}
    assert "cgd.pid" in modes and set(modes.values()) == {0o600}, modes  # as docs/state-files.md says


def test_while_cgd_runs_no_other_process_writes_its_state(cgd: Cgd) -> None:
    from computegroups.statefiles import StateLockedError
    from computegroups.statefiles.store import StateStore

    with pytest.raises(StateLockedError, match=f"^state is locked by pid {cgd.pid} "), \
            StateStore(cgd.state_dir, lock_timeout=0.1).transaction():
        pass
    assert cgd.request("POST", "/v1/gpus/0/drain")[0] == 200, "cgd itself still commits"
    cgd.stop()
    with StateStore(cgd.state_dir, lock_timeout=5).transaction() as doc:
        assert doc.drained, "cgd let go of the lock when it stopped"


def test_kill9_adopts_workers_without_restart(start_cgd) -> None:
    cgd = start_cgd("dgx-h100")
    allocate(cgd, {"name": "svc", "claim": {"gpus": 2}, "replicas": 2, "command": worker_cmd()})

    def replica_pids() -> list[int] | None:
        replicas = cgd.request("GET", "/v1/components/svc")[1]["replicas"]
        return [r["pids"][0] for r in replicas] if all(r["pids"] for r in replicas) else None

    pids = wait_for(replica_pids)
    cgd.kill9()
    for pid in pids:
        assert psutil.pid_exists(pid), "workers survive the daemon's SIGKILL"
    cgd.start()
    reply = cgd.request("GET", "/v1/components/svc")[1]
    assert sorted(p for r in reply["replicas"] for p in r["pids"]) == sorted(pids), "adopted, not restarted"
    # Once an adopted worker exits, cgd supervises a fresh one again.
    os.kill(pids[0], signal.SIGKILL)
    fresh = wait_for(lambda: [p for r in cgd.request("GET", "/v1/components/svc")[1]["replicas"]
                              for p in r["pids"] if p not in pids])
    assert fresh


def test_sigterm_stops_workers_and_keep_workers_leaves_them(start_cgd) -> None:
    cgd = start_cgd("workstation-4x-pcie")
    allocate(cgd, {"name": "w", "claim": {"gpus": 1}, "command": worker_cmd()})
    pid = wait_for(lambda: cgd.request("GET", "/v1/components/w")[1]["replicas"][0]["pids"])[0]
    assert cgd.stop() == 0
    wait_for(lambda: ended(pid))

    cgd.extra_args = ("--keep-workers",)
    cgd.start()
    pid2 = wait_for(lambda: cgd.request("GET", "/v1/components/w")[1]["replicas"][0]["pids"])[0]
    assert pid2 != pid, "a stopped worker starts again with the daemon"
    assert cgd.stop() == 0
    assert psutil.pid_exists(pid2)
    cgd.extra_args = ()
    cgd.start()
    assert cgd.request("GET", "/v1/components/w")[1]["replicas"][0]["pids"] == [pid2]


def test_shadow_promotion(cgd: Cgd) -> None:
    allocate(cgd, {"name": "web", "claim": {"gpus": 1}, "command": worker_cmd()})
    allocate(cgd, {"name": "web-standby", "shadow_of": "web", "command": worker_cmd()})
    primary = wait_for(lambda: cgd.request("GET", "/v1/components/web")[1]["replicas"][0]["pids"])[0]
    shadow = wait_for(lambda: cgd.request("GET", "/v1/components/web-standby")[1]["replicas"][0]["pids"])[0]
    assert proc_env(shadow)["CUDA_VISIBLE_DEVICES"] == proc_env(primary)["CUDA_VISIBLE_DEVICES"]
    assert proc_env(shadow)["CG_ROLE"] == "shadow"
    role_file = Path(proc_env(shadow)["CG_ROLE_FILE"])
    assert role_file.read_text().strip() == "shadow"
    # The shadow must have installed its SIGUSR1 handler before it can be promoted.
    shadow_log = cgd.log_dir / "web-standby" / "0.out"
    wait_for(lambda: shadow_log.exists() and "started shadow" in shadow_log.read_text())
    # cgd promotes only a shadow that has run for a second (computegroups.daemon.core.events.PROMOTION_MIN_UPTIME_S).
    wait_for(lambda: time.time() - psutil.Process(shadow).create_time() >= 1.1)
    os.kill(primary, signal.SIGKILL)
    wait_for(lambda: role_file.read_text().strip() == "primary", timeout=5)
    reply = cgd.request("GET", "/v1/components/web-standby")[1]["replicas"][0]
    assert reply["role"] == "primary" and reply["pids"] == [shadow]
    new_shadow = wait_for(lambda: [p for p in cgd.request("GET", "/v1/components/web")[1]["replicas"][0]["pids"]
                                   if p != primary])[0]
    assert proc_env(new_shadow)["CG_ROLE"] == "shadow"
    out = wait_for(lambda: [p for p in cgd.log_dir.rglob("*")
                            if p.is_file() and "promoted to primary" in p.read_text()])
    assert out


def test_injected_gpu_fault_drains_and_degrades(start_cgd, tmp_path: Path) -> None:
    config = tmp_path / "cgd.toml"
    config.write_text("[health]\ninterval_s = 0.2\n")
    cgd = start_cgd("dgx-h100", "--config", str(config))
    allocate(cgd, {"name": "victim", "claim": {"gpu_ids": [3], "gpus": 1}})
    cgd.faults_file.write_text(json.dumps({"xid": [{"gpu": 3, "code": 79}],
                                           "processes": [{"gpu": 5, "pid": 999999, "used_memory_mib": 4096}]}))
    def degraded():
        status = cgd.request("GET", "/v1/status")[1]
        gpu3 = status["gpus"][3]
        return gpu3 if gpu3["drained"] and gpu3["degraded"] else None
    gpu3 = wait_for(degraded)
    assert "79" in " ".join(gpu3["reasons"])
    gpu5 = cgd.request("GET", "/v1/status")[1]["gpus"][5]
    assert gpu5["memory_foreign_mib"] == 4096
    assert cgd.request("GET", "/v1/components/victim")[1]["state"] == "degraded"
    status, reply = cgd.request("POST", "/v1/components", {"name": "x", "claim": {"gpu_ids": [3], "gpus": 1}})
    assert status in (409, 422), reply
    status, reply = cgd.request("POST", "/v1/groups/victim-0/drain")
    assert status == 200 and reply["state"] == "degraded", "draining keeps saying why the group is unusable"
    # Once the GPU is healthy again, undraining it brings its groups back.
    cgd.faults_file.write_text("{}")
    wait_for(lambda: cgd.request("GET", "/v1/status")[1]["gpus"][3]["health"] == "ok")
    assert cgd.request("POST", "/v1/gpus/3/undrain")[0] == 200
    assert cgd.request("GET", "/v1/components/victim")[1]["state"] == "allocated"
    assert state_file(cgd)["groups"]["victim-0"]["state"] == "allocated"


LEASE_CLIENT = """\
import json, sys, time
sys.path.insert(0, {root!r})
from tests.daemon_fixture import UnixHTTPConnection
for body in {bodies!r}:
    c = UnixHTTPConnection({socket!r})
    c.request('POST', '/v1/components', body=json.dumps(body), headers={{'Content-Type': 'application/json'}})
    print(c.getresponse().status, flush=True)
time.sleep(60)
"""


def lease_client(cgd: Cgd, bodies: list[dict[str, Any]]) -> tuple[subprocess.Popen[str], IO[str]]:
    """A client process that asks for `bodies` (leases) and stays, holding
    its connections, until killed; and its output, one status per body."""
    code = LEASE_CLIENT.format(root=str(Path(__file__).parents[3]), bodies=bodies, socket=str(cgd.socket))
    client = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert client.stdout is not None
    return client, client.stdout


def test_lease_released_when_client_dies(cgd: Cgd) -> None:
    client, answers = lease_client(cgd, [{"name": "leased", "claim": {"gpus": 1}, "lease": True}])
    assert answers.readline().strip() == "201"
    assert cgd.request("GET", "/v1/components/leased")[0] == 200
    client.kill()
    client.wait()
    answers.close()
    wait_for(lambda: cgd.request("GET", "/v1/components/leased")[0] == 404, timeout=15)


def test_release_cut_short_by_a_crash_is_finished_on_restart(start_cgd) -> None:
    from msgspec.structs import replace

    from computegroups.statefiles.store import StateStore

    cgd = start_cgd("dgx-h100")
    allocate(cgd, {"name": "half", "claim": {"gpus": 1}, "command": worker_cmd()})
    allocate(cgd, {"name": "keep", "claim": {"gpus": 1}, "command": worker_cmd()})
    half = wait_for(lambda: cgd.request("GET", "/v1/components/half")[1]["replicas"][0]["pids"])[0]
    keep = wait_for(lambda: cgd.request("GET", "/v1/components/keep")[1]["replicas"][0]["pids"])[0]
    cgd.kill9()
    # What a crash between "releasing" and the workers' stop leaves behind.
    with StateStore(cgd.state_dir).transaction() as doc:
        doc.components["half"] = replace(doc.components["half"], state="releasing")
    cgd.start()
    wait_for(lambda: ended(half))
    assert cgd.request("GET", "/v1/components/half")[0] == 404
    assert "half-0" not in state_file(cgd)["groups"]
    assert cgd.request("GET", "/v1/components/keep")[1]["replicas"][0]["pids"] == [keep]


def test_worker_over_its_share_is_stopped_when_policy_says_so(start_cgd, tmp_path: Path) -> None:
    config = tmp_path / "cgd.toml"
    config.write_text('[health]\ninterval_s = 0.2\n[shares]\nenforcement = "stop"\n')
    cgd = start_cgd("dgx-h100", "--config", str(config))
    comp = allocate(cgd, {"name": "greedy", "claim": {"memory_mib": 10240}, "command": worker_cmd(),
                          "restart": {"max_retries": 0}})
    gpu = comp["replicas"][0]["devices"][0]["index"]
    pid = wait_for(lambda: cgd.request("GET", "/v1/components/greedy")[1]["replicas"][0]["pids"])[0]
    cgd.faults_file.write_text(json.dumps({"processes": [{"gpu": gpu, "pid": pid, "used_memory_mib": 30000}]}))
    wait_for(lambda: ended(pid))
    over = cgd.request("GET", "/v1/status")[1]["gpus"][gpu]["over_share"]
    assert over == [] or over[0]["replica"] == "greedy/0"
    assert "over its share" in cgd.log()


def test_scale_to_zero_and_back(cgd: Cgd) -> None:
    allocate(cgd, {"name": "z", "claim": {"gpus": 1}, "replicas": 2})
    assert cgd.request("POST", "/v1/components/z/scale", {"replicas": 0})[0] == 200
    assert state_file(cgd)["groups"] == {}
    status, reply = cgd.request("POST", "/v1/components/z/scale", {"replicas": 1})
    assert status == 200 and len(reply["replicas"]) == 1, reply


def test_a_reservation_cannot_be_taken_through_sharing(cgd: Cgd) -> None:
    assert cgd.request("POST", "/v1/reservations", {"name": "held", "claim": {"gpus": 2}, "ttl_s": 600})[0] == 201
    allocate(cgd, {"name": "base", "claim": {"memory_mib": 1000}})
    before = state_file(cgd)
    status, reply = cgd.request("POST", "/v1/components", {"name": "held", "share_with": "base"})
    assert status == 409 and "reservation 'held' exists" in reply["error"]["message"]
    assert state_file(cgd) == before
    status, reply = cgd.request("GET", "/v1/components/base/logs?offset=-3")
    assert status == 400


# A worker that ignores SIGTERM: stopping it takes its whole grace period.
STUBBORN = ("import signal, time\nsignal.signal(signal.SIGTERM, lambda *_: print('term', flush=True))\n"
            "print('ready', flush=True)\nwhile True: time.sleep(0.05)\n")
"""A worker that outlives SIGTERM (it only notes it), so stopping it takes its whole stop timeout."""


def wait_ready(cgd: Cgd, name: str, replica: int = 0) -> None:
    log = cgd.log_dir / name / f"{replica}.out"
    wait_for(lambda: log.exists() and "ready" in log.read_text())


def wait_told_to_stop(cgd: Cgd, name: str, replica: int) -> None:
    """Until a STUBBORN replica got its SIGTERM: its stop is under way."""
    log = cgd.log_dir / name / f"{replica}.out"
    wait_for(lambda: "term" in log.read_text())


def test_a_slow_stop_does_not_stall_other_requests(cgd: Cgd) -> None:
    import threading

    allocate(cgd, {"name": "slow", "claim": {"gpus": 1}, "command": [sys.executable, "-c", STUBBORN],
                   "stop_timeout_s": 4})
    pid = wait_for(lambda: cgd.request("GET", "/v1/components/slow")[1]["replicas"][0]["pids"])[0]
    wait_ready(cgd, "slow")
    released: list[tuple[int, Any]] = []
    began = time.monotonic()
    releaser = threading.Thread(target=lambda: released.append(cgd.request("DELETE", "/v1/components/slow")))
    releaser.start()
    wait_for(lambda: state_file(cgd)["components"].get("slow", {}).get("state") == "releasing")
    # While the release waits out the grace period, other requests are answered at once.
    allocate(cgd, {"name": "other", "claim": {"gpus": 1}})
    assert cgd.request("GET", "/v1/status")[0] == 200
    status, reply = cgd.request("POST", "/v1/components", {"name": "rider", "share_with": "slow"})
    assert status == 409 and "being released" in reply["error"]["message"], reply
    status, reply = cgd.request("DELETE", "/v1/components/slow")
    assert status == 409 and "being released" in reply["error"]["message"], reply
    assert time.monotonic() - began < 3.5
    assert not ended(pid)
    releaser.join(timeout=20)
    assert released[0][0] == 200 and released[0][1]["released"] == ["slow"], released
    assert time.monotonic() - began >= 4
    assert "slow" not in state_file(cgd)["components"] and "slow-0" not in state_file(cgd)["groups"]


def test_a_slow_scale_in_does_not_stall_other_requests(cgd: Cgd) -> None:
    import threading

    allocate(cgd, {"name": "wide", "claim": {"gpus": 1}, "replicas": 2,
                   "command": [sys.executable, "-c", STUBBORN], "stop_timeout_s": 3})
    wait_ready(cgd, "wide", 0)
    wait_ready(cgd, "wide", 1)
    scaled: list[tuple[int, Any]] = []
    scaler = threading.Thread(target=lambda: scaled.append(
        cgd.request("POST", "/v1/components/wide/scale", {"replicas": 1})))
    began = time.monotonic()
    scaler.start()
    wait_told_to_stop(cgd, "wide", 1)
    allocate(cgd, {"name": "other", "claim": {"gpus": 1}})
    status, reply = cgd.request("POST", "/v1/components/wide/scale", {"replicas": 2})
    assert status == 409 and "being scaled in" in reply["error"]["message"], reply
    assert time.monotonic() - began < 2.5
    scaler.join(timeout=20)
    assert scaled[0][0] == 200 and len(scaled[0][1]["replicas"]) == 1, scaled
    assert sorted(state_file(cgd)["groups"]) == ["other-0", "wide-0"]


def test_a_worker_that_cannot_start_leaves_its_reservation_held(cgd: Cgd) -> None:
    assert cgd.request("POST", "/v1/reservations", {"name": "booked", "claim": {"gpus": 2}, "ttl_s": 600})[0] == 201
    before = state_file(cgd)
    # A directory where the worker's log file goes: its start fails.
    (cgd.log_dir / "booked" / "0.out").mkdir(parents=True)
    status, reply = cgd.request("POST", "/v1/components", {"name": "booked", "command": worker_cmd()})
    assert status == 400 and "could not start the workers of 'booked'" in reply["error"]["message"], reply
    after = state_file(cgd)
    assert {k: after[k] for k in ("components", "groups", "reservations", "workers")} == \
        {k: before[k] for k in ("components", "groups", "reservations", "workers")}
    assert cgd.request("GET", "/v1/reservations")[1]["reservations"][0]["name"] == "booked"
    (cgd.log_dir / "booked" / "0.out").rmdir()
    allocate(cgd, {"name": "booked", "command": worker_cmd()})
    assert state_file(cgd)["reservations"] == {}


def test_a_failed_replica_comes_back_with_restart(cgd: Cgd, tmp_path: Path) -> None:
    marker = tmp_path / "crashed-once"
    flaky = f"test -f {marker} || {{ touch {marker}; exit 3; }}; echo serving; exec sleep 60"
    allocate(cgd, {"name": "flaky", "claim": {"gpus": 1}, "command": ["/bin/sh", "-c", flaky],
                   "restart": {"max_retries": 0}})
    allocate(cgd, {"name": "holder", "claim": {"gpus": 1}})
    failed = wait_for(lambda: (c := cgd.request("GET", "/v1/components/flaky")[1])["state"] == "failed" and c)
    assert failed["replicas"][0]["state"] == "failed" and failed["replicas"][0]["pids"] == []
    before = state_file(cgd)
    for args, message in ((("restart", "flaky", "--replica", "1"), "'flaky' has replicas 0..0, not 1"),
                          (("restart", "nosuch"), "no component named 'nosuch'"),
                          (("restart", "holder"), "'holder' runs no command")):
        done = cgd.cgctl(*args)
        assert done.returncode != 0 and message in done.stderr and len(done.stderr.splitlines()) == 1, done
    assert state_file(cgd)["components"] == before["components"]
    done = cgd.cgctl("restart", "flaky")
    assert done.returncode == 0 and done.stdout.startswith("restarted flaky: 1 replica (running)"), done
    pid = wait_for(lambda: cgd.request("GET", "/v1/components/flaky")[1]["replicas"][0]["pids"])[0]
    assert proc_env(pid)["CG_COMPONENT"] == "flaky"
    assert state_file(cgd)["components"]["flaky"]["state"] == "running"
    status, reply = cgd.request("POST", "/v1/components/flaky/restart", {"replica": "0"})
    assert status == 400 and reply["error"]["message"] == "replica: expected an integer, got '0'", reply
    status, reply = cgd.request("POST", "/v1/components/flaky/restart", {"replica": 0})
    assert status == 200 and reply["replicas"][0]["pids"] != [pid], reply
    assert ended(pid)


def test_a_promotion_cut_short_by_a_crash_is_finished_on_restart(start_cgd) -> None:
    """cgd killed after committing a promotion but before telling the shadow."""
    from msgspec.structs import replace

    from computegroups.statefiles.store import StateStore

    cgd = start_cgd("dgx-h100")
    primary, shadow, shadow_log = web_with_shadow(cgd, promotable=False)
    role_file = Path(proc_env(shadow)["CG_ROLE_FILE"])
    cgd.kill9()
    os.kill(primary, signal.SIGKILL)
    with StateStore(cgd.state_dir).transaction() as doc:
        doc.workers["web-standby/0"] = replace(doc.workers["web-standby/0"], role="primary", promotions=1)
        doc.workers["web/0"] = replace(doc.workers["web/0"], role="shadow", pid=None, create_time=None)
    assert role_file.read_text().strip() == "shadow"
    cgd.start()
    assert role_file.read_text().strip() == "primary"
    wait_for(lambda: "promoted to primary" in shadow_log.read_text())
    assert "finished promoting web-standby/0" in cgd.log()
    reply = cgd.request("GET", "/v1/components/web-standby")[1]["replicas"][0]
    assert reply["role"] == "primary" and reply["pids"] == [shadow]
    restarted = wait_for(lambda: cgd.request("GET", "/v1/components/web")[1]["replicas"][0]["pids"])[0]
    assert restarted != primary and proc_env(restarted)["CG_ROLE"] == "shadow"


def test_a_shadow_on_its_way_out_is_not_promoted(cgd: Cgd) -> None:
    import threading

    allocate(cgd, {"name": "web", "claim": {"gpus": 1}, "command": worker_cmd()})
    allocate(cgd, {"name": "stby", "shadow_of": "web", "command": [sys.executable, "-c", STUBBORN],
                   "stop_timeout_s": 3})
    primary = wait_for(lambda: cgd.request("GET", "/v1/components/web")[1]["replicas"][0]["pids"])[0]
    wait_ready(cgd, "stby")
    shadow = cgd.request("GET", "/v1/components/stby")[1]["replicas"][0]["pids"][0]
    wait_for(lambda: time.time() - psutil.Process(shadow).create_time() >= 1.1)
    releaser = threading.Thread(target=lambda: cgd.request("DELETE", "/v1/components/stby"))
    releaser.start()
    wait_for(lambda: state_file(cgd)["components"].get("stby", {}).get("state") == "releasing")
    os.kill(primary, signal.SIGKILL)
    releaser.join(timeout=20)
    restarted = wait_for(lambda: [p for p in cgd.request("GET", "/v1/components/web")[1]["replicas"][0]["pids"]
                                  if p != primary])[0]
    assert proc_env(restarted)["CG_ROLE"] == "primary"
    assert state_file(cgd)["workers"]["web/0"]["role"] == "primary"
    assert "stby" not in state_file(cgd)["components"]


def test_a_sharer_cannot_grow_onto_groups_being_scaled_in(cgd: Cgd) -> None:
    import threading

    allocate(cgd, {"name": "pp", "claim": {"gpus": 1}, "replicas": 2,
                   "command": [sys.executable, "-c", STUBBORN], "stop_timeout_s": 3})
    allocate(cgd, {"name": "xx", "share_with": "pp"})
    wait_ready(cgd, "pp", 0)
    wait_ready(cgd, "pp", 1)
    scaled: list[tuple[int, Any]] = []
    scaler = threading.Thread(target=lambda: scaled.append(
        cgd.request("POST", "/v1/components/pp/scale", {"replicas": 1})))
    scaler.start()
    wait_told_to_stop(cgd, "pp", 1)
    for method, path, body in (("POST", "/v1/components/xx/scale", {"replicas": 2}),
                               ("POST", "/v1/components", {"name": "yy", "share_with": "xx"})):
        status, reply = cgd.request(method, path, body)
        assert status == 409 and "'pp' is being scaled in" in reply["error"]["message"], (path, reply)
    scaler.join(timeout=20)
    assert scaled[0][0] == 200 and len(scaled[0][1]["replicas"]) == 1, scaled
    assert sorted(state_file(cgd)["groups"]) == ["pp-0"]


def test_an_expired_lease_does_not_release_a_new_component_of_its_name(start_cgd, tmp_path: Path) -> None:
    config = tmp_path / "cgd.toml"
    config.write_text("[health]\ninterval_s = 0.2\n")
    cgd = start_cgd("dgx-h100", "--config", str(config))
    bodies = [{"name": "aaa", "claim": {"gpus": 1}, "lease": True, "command": [sys.executable, "-c", STUBBORN],
               "stop_timeout_s": 3},
              {"name": "bbb", "claim": {"gpus": 1}, "lease": True}]
    client, answers = lease_client(cgd, bodies)
    assert [answers.readline().strip() for _ in bodies] == ["201", "201"]
    wait_ready(cgd, "aaa")
    client.kill()
    client.wait()
    answers.close()
    wait_for(lambda: state_file(cgd)["components"].get("aaa", {}).get("state") == "releasing")
    assert cgd.request("DELETE", "/v1/components/bbb")[0] == 200
    allocate(cgd, {"name": "bbb", "claim": {"gpus": 1}})
    wait_for(lambda: "released aaa" in cgd.log(), timeout=15)
    time.sleep(0.6)
    assert cgd.request("GET", "/v1/components/bbb")[0] == 200, cgd.log()
    assert "released bbb" not in cgd.log(), cgd.log()


def test_a_shadow_is_told_at_once_even_while_the_lock_is_busy(cgd: Cgd) -> None:
    """The promotion signal does not wait behind an allocation that spawns many workers."""
    import threading

    primary, shadow, shadow_log = web_with_shadow(cgd, {"memory_mib": 1024})
    role_file = Path(proc_env(shadow)["CG_ROLE_FILE"])
    body = {"name": "crowd", "claim": {"memory_mib": 256}, "replicas": 120, "scope": "all-replicas",
            "command": [shutil.which("sleep") or "/bin/sleep", "600"]}
    answers: list[tuple[int, Any]] = []
    crowd = threading.Thread(target=lambda: answers.append(cgd.request("POST", "/v1/components", body, timeout=60)))
    crowd.start()
    wait_for(lambda: "crowd" in state_file(cgd)["components"], interval=0.01)
    os.kill(primary, signal.SIGKILL)
    wait_for(lambda: role_file.read_text().strip() == "primary", timeout=5, interval=0.005)
    told_while_busy = crowd.is_alive()
    crowd.join(timeout=60)
    assert told_while_busy, "the shadow heard only after the allocation released the lock"
    wait_for(lambda: "promoted to primary" in shadow_log.read_text())
    wait_for(lambda: state_file(cgd)["workers"]["web-standby/0"]["role"] == "primary")
    assert answers[0][0] == 201 and len(answers[0][1]["replicas"]) == 120


def test_a_primary_that_died_while_cgd_was_down_fails_over(start_cgd) -> None:
    cgd = start_cgd("dgx-h100")
    primary, shadow, shadow_log = web_with_shadow(cgd)
    cgd.kill9()
    os.kill(primary, signal.SIGKILL)
    cgd.start()
    wait_for(lambda: "promoted to primary" in shadow_log.read_text())
    assert "web/0 died while cgd was down: its shadow web-standby/0 is primary now" in cgd.log()
    reply = cgd.request("GET", "/v1/components/web-standby")[1]["replicas"][0]
    assert reply["role"] == "primary" and reply["pids"] == [shadow]
    restarted = wait_for(lambda: cgd.request("GET", "/v1/components/web")[1]["replicas"][0]["pids"])[0]
    assert restarted != primary and proc_env(restarted)["CG_ROLE"] == "shadow"


def test_a_drained_group_can_be_undrained(cgd: Cgd) -> None:
    allocate(cgd, {"name": "a", "claim": {"memory_mib": 1024, "gpu_ids": [2]}})
    status, reply = cgd.request("POST", "/v1/groups/a-0/drain")
    assert status == 200 and reply["state"] == "draining", reply
    status, reply = cgd.request("POST", "/v1/components", {"name": "b", "claim": {"memory_mib": 1024, "gpu_ids": [2]}})
    assert status in (409, 422), reply
    status, reply = cgd.request("POST", "/v1/groups/a-0/undrain")
    assert status == 200 and reply["state"] == "allocated", reply
    allocate(cgd, {"name": "b", "claim": {"memory_mib": 1024, "gpu_ids": [2]}})
    assert cgd.request("POST", "/v1/groups/nosuch/undrain")[0] == 404


def test_a_state_that_gives_one_gpu_to_two_groups_is_refused_at_start(start_cgd) -> None:
    cgd = start_cgd("dgx-h100")
    allocate(cgd, {"name": "one", "claim": {"gpus": 1, "gpu_ids": [3]}})
    allocate(cgd, {"name": "two", "claim": {"gpus": 1, "gpu_ids": [4]}})
    assert cgd.stop() == 0
    data = state_file(cgd)
    data["groups"]["two-0"]["devices"] = data["groups"]["one-0"]["devices"]
    cgd.write_state(data)
    again = subprocess.run(cgd.command(), env=cgd.env(), capture_output=True, text=True, timeout=30)
    assert again.returncode == 3
    error = again.stderr.splitlines()[-1]
    assert error.startswith("cgd: error: the state (generation"), again.stderr
    assert "GPU 3 is held whole by group one-0 and also by group two-0" in error


def test_health_counts_workers_not_their_processes(cgd: Cgd) -> None:
    parent = ("import subprocess, sys, time\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
              "time.sleep(600)\n")
    allocate(cgd, {"name": "fam", "claim": {"memory_mib": 1024}, "replicas": 2,
                   "command": [sys.executable, "-c", parent]})
    wait_for(lambda: all(len(r["pids"]) >= 1 for r in cgd.request("GET", "/v1/components/fam")[1]["replicas"]))
    assert cgd.request("GET", "/v1/health")[1]["workers"] == {"expected": 2, "running": 2}


def test_a_pool_naming_a_gpu_the_machine_lacks_is_refused_at_start(start_cgd, tmp_path: Path) -> None:
    config = tmp_path / "cgd.toml"
    config.write_text("[pools]\nfast = [6, 7, 9]\n")
    with pytest.raises(RuntimeError) as failed:
        start_cgd("dgx-h100", "--config", str(config))
    assert "cgd exited with 3" in str(failed.value)
    assert f"cgd: error: {config}: pools.fast: no GPU 9 on this machine (it has GPUs 0-7)" in str(failed.value)


def test_no_file_deleted_in_the_state_directory_lets_a_second_cgd_in(start_cgd, cgd: Cgd) -> None:
    for leftover in cgd.state_dir.iterdir():
        if leftover.suffix in (".lock", ".pid") or leftover.name.endswith(".holder"):
            leftover.unlink()
    second = subprocess.run(
        [*cgd.command()[:-6], "--socket", str(cgd.root / "other.sock"),
         "--state-dir", str(cgd.state_dir), "--log-dir", str(cgd.log_dir)],
        env=cgd.env(), capture_output=True, text=True, timeout=30,
    )
    assert second.returncode == 3, second.stderr
    assert f"cgd already runs as pid ? for {cgd.state_dir}" in second.stderr
    assert cgd.request("GET", "/v1/version")[0] == 200


LEAVES_A_CHILD = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(600)'])\n"
    "open(sys.argv[1], 'a').write(f'{child.pid}\\n')\n"
    "time.sleep(0.3)\n"
    "sys.exit(1)\n"
)


def test_nothing_a_worker_left_running_outlives_it(cgd: Cgd, tmp_path: Path) -> None:
    """A worker that leaves a child outside its process group (setsid) and exits: the child is
    stopped before the worker restarts, and nothing of it runs once the component is released."""
    from computegroups.daemon.supervision.processes import start_time

    children = tmp_path / "children"
    allocate(cgd, {"name": "leaky", "claim": {"gpus": 1}, "command": [sys.executable, "-c", LEAVES_A_CHILD,
                                                                     str(children)],
                   "restart": {"max_retries": 5, "backoff_s": 0.2}, "stop_timeout_s": 2})

    def pids() -> list[int]:
        return [int(line) for line in children.read_text().split()] if children.exists() else []

    wait_for(lambda: len(pids()) >= 2)
    first = pids()[0]
    assert start_time(first) is None, "the first run's child was stopped before the restart"
    assert cgd.request("DELETE", "/v1/components/leaky")[0] == 200
    assert [p for p in pids() if start_time(p) is not None] == [], "nothing of it runs after the release"


def test_sigterm_after_a_kill9_stops_the_adopted_workers_too(start_cgd) -> None:
    from computegroups.daemon.supervision.processes import start_time

    cgd = start_cgd("dgx-h100")
    allocate(cgd, {"name": "svc", "claim": {"gpus": 1}, "command": worker_cmd()})
    pid = wait_for(lambda: cgd.request("GET", "/v1/components/svc")[1]["replicas"][0]["pids"])[0]
    cgd.kill9()
    cgd.start()
    assert cgd.request("GET", "/v1/components/svc")[1]["replicas"][0]["pids"] == [pid], "adopted"
    assert cgd.stop() == 0
    assert start_time(pid) is None, "an adopted worker is cgd's like any other: it stops with cgd"
    assert "svc.0 (pid" in cgd.log() and "ended with signal SIGTERM" in cgd.log(), \
        "its end is told for what it is (its launch shim wrote it), not 'None'"
