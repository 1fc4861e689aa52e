"""`/metrics` and `/v1/events` of a real cgd, after a known sequence of operations.

The sequence: a granted claim, a refused one, a queued one, a primary with a
shadow whose primary is killed (a promotion). Metrics are scraped over the
Unix socket and over TCP and parsed with prometheus_client's own parser;
events are followed while it happens and read again from a sequence number.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from computegroups.daemon.client.sync import CgdClient
from tests.daemon_fixture import Cgd, UnixHTTPConnection, _executable, wait_for

pytestmark = pytest.mark.slow

# Sleeps; on SIGUSR1 (a promotion) says so and goes on.
WORKER = [sys.executable, "-c",
          "import signal, time\n"
          "signal.signal(signal.SIGUSR1, lambda *_: print('promoted', flush=True))\n"
          "print('ready', flush=True)\n"
          "while True: time.sleep(0.05)\n"]


def config(tmp_path: Path, extra: str = "") -> str:
    path = tmp_path / "cgd.toml"
    path.write_text(extra + "[health]\ninterval_s = 0.2\n")
    return str(path)


def scrape_unix(cgd: Cgd) -> str:
    conn = UnixHTTPConnection(str(cgd.socket))
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type", "").startswith("text/plain")
        return resp.read().decode()
    finally:
        conn.close()


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample by name, as Prometheus would read the page."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def value(found: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    matching = [v for lab, v in found.get(name, []) if all(lab.get(k) == want for k, want in labels.items())]
    assert len(matching) == 1, (name, labels, found.get(name))
    return matching[0]


def pids_of(cgd: Cgd, name: str) -> list[int]:
    status, reply = cgd.request("GET", f"/v1/components/{name}")
    return reply["replicas"][0]["pids"] if status == 200 else []


def promote(cgd: Cgd) -> int:
    """Start `web` (GPU 2) and its shadow, wait until the shadow can take over, kill `web`:
    the shadow's pid, once it is primary."""
    for body in ({"name": "web", "claim": {"gpus": 1, "gpu_ids": [2]}, "command": WORKER},
                 {"name": "web-standby", "shadow_of": "web", "command": WORKER}):
        status, reply = cgd.request("POST", "/v1/components", body)
        assert status == 201, reply
    primary = wait_for(lambda: pids_of(cgd, "web"), "web runs")[0]
    shadow = wait_for(lambda: pids_of(cgd, "web-standby"), "the shadow runs")[0]
    log = cgd.log_dir / "web-standby" / "0.out"
    wait_for(lambda: log.exists() and "ready" in log.read_text(), "the shadow handles SIGUSR1")
    started = cgd.request("GET", "/v1/components/web-standby")[1]["replicas"][0]["started_at"]
    # cgd promotes only a shadow that has run for a second (core/base.py PROMOTION_MIN_UPTIME_S).
    wait_for(lambda: time.time() - started >= 1.2, "the shadow is old enough to be promoted", timeout=15)
    os.kill(primary, signal.SIGKILL)
    wait_for(lambda: cgd.request("GET", "/v1/components/web-standby")[1]["replicas"][0]["role"] == "primary",
             "the shadow is primary")
    return shadow


def test_metrics_over_the_socket_and_tcp_match_the_state(start_cgd, tmp_path: Path) -> None:
    cgd = start_cgd("dgx-h100", "--config", config(tmp_path), "--metrics-listen", "127.0.0.1:0")
    cgd.faults_file.write_text(json.dumps({"worker_memory_mib": {"0": 2048, "2": 1024}}))
    status, reply = cgd.request("POST", "/v1/components", {"name": "train", "claim": {"gpus": 1, "gpu_ids": [0]},
                                                           "command": WORKER})
    assert status == 201, reply
    status, reply = cgd.request("POST", "/v1/components", {"name": "half", "claim": {"memory_mib": 20480,
                                                                                     "gpu_ids": [1]}})
    assert status == 201, reply
    status, reply = cgd.request("POST", "/v1/components", {"name": "huge", "claim": {"gpus": 9}})
    assert status == 422, reply
    promote(cgd)
    status, reply = cgd.request("POST", "/v1/components", {"name": "later", "claim": {"gpus": 8}, "wait": True,
                                                           "detach": True})
    assert status == 201 and reply["state"] == "pending", reply
    wait_for(lambda: all(c["memory_used_mib"] for g in cgd.request("GET", "/v1/status")[1]["gpus"][:3]
                         for c in g["components"] if c["name"] in ("train", "web", "web-standby")),
             "the workers measured")

    found = samples(scrape_unix(cgd))
    state = cgd.request("GET", "/v1/status")[1]
    mib = 1024 * 1024
    for g in state["gpus"]:
        labels = {"gpu": str(g["index"]), "UUID": g["uuid"], "modelName": g["name"], "Hostname": "dgx-h100-sim"}
        assert value(found, "computegroups_gpu_memory_total_bytes", **labels) == g["memory_mib"] * mib
        assert value(found, "computegroups_gpu_memory_claimed_bytes", **labels) == g["memory_allocated_mib"] * mib
        assert value(found, "computegroups_gpu_compute_claimed_ratio", **labels) == g["compute_allocated_pct"] / 100
        assert value(found, "computegroups_gpu_memory_used_bytes", **labels) == g["measured"]["memory_used_mib"] * mib
    gpu0 = {"gpu": "0"}
    assert value(found, "computegroups_gpu_memory_free_bytes", **gpu0) == 0
    assert value(found, "computegroups_gpu_memory_free_bytes", gpu="1") == (81559 - 20480) * mib
    assert value(found, "computegroups_gpu_memory_used_bytes", **gpu0) == 2048 * mib
    assert value(found, "computegroups_worker_gpu_memory_used_bytes", component="train", replica="0",
                 gpu="0") == 2048 * mib
    assert value(found, "computegroups_allocations_total", result="refused") == 1
    assert value(found, "computegroups_allocations_total", result="queued") == 1
    assert value(found, "computegroups_allocations_total", result="granted") == 3  # not the shadow
    assert value(found, "computegroups_shadow_promotions_total") == 1
    assert value(found, "computegroups_shadow_promotion_seconds_count") == 1
    assert value(found, "computegroups_worker_exits_total", cause="signal") == 1
    assert value(found, "computegroups_worker_starts_total") >= 4  # and the old primary again, as a shadow
    assert value(found, "computegroups_allocation_decision_seconds_count") >= 3
    assert value(found, "computegroups_allocation_commit_seconds_count") == 3  # the granted ones only
    assert value(found, "computegroups_components", state="pending") == 1
    assert value(found, "computegroups_components", state="running") == 3
    assert value(found, "computegroups_components", state="allocated") == 1
    assert value(found, "computegroups_groups", state="allocated") == 3
    journal = Path(cgd.state_dir / "state.journal").stat().st_size
    assert value(found, "computegroups_state_file_bytes", file="journal") == journal
    assert value(found, "computegroups_state_commit_seconds_count") >= 5
    assert value(found, "computegroups_build_info", version="0.1.0") == 1

    address = cgd.request("GET", "/v1/version")[1]["metrics_listen"]
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        over_tcp = samples(resp.read().decode())
    assert over_tcp["computegroups_gpu_memory_claimed_bytes"] == found["computegroups_gpu_memory_claimed_bytes"]
    assert value(over_tcp, "computegroups_allocations_total", result="refused") == 1
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://{address}/v1/status", timeout=10)
    refused.value.close()
    assert refused.value.code == 404, "TCP serves /metrics and nothing else"

    # A GPU fault is counted against its GPU.
    cgd.faults_file.write_text(json.dumps({"xid": [{"gpu": 5, "code": 79}]}))
    wait_for(lambda: "computegroups_gpu_health_events_total" in samples(scrape_unix(cgd)), "the Xid counted")
    assert value(samples(scrape_unix(cgd)), "computegroups_gpu_health_events_total", gpu="5", kind="xid") == 1


def test_metrics_listen_is_off_by_default_and_a_bad_address_is_refused(start_cgd, cgd: Cgd, tmp_path: Path) -> None:
    assert cgd.request("GET", "/v1/version")[1]["metrics_listen"] is None
    bad = Cgd(tmp_path / "bad", "dgx-h100", ("--metrics-listen", "localhost"))
    with pytest.raises(RuntimeError, match="metrics_listen"):
        bad.start(timeout=10)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        busy = Cgd(tmp_path / "busy", "dgx-h100", ("--metrics-listen", f"127.0.0.1:{port}"))
        with pytest.raises(RuntimeError, match=f"metrics_listen 127.0.0.1:{port}"):
            busy.start(timeout=20)
        busy.cleanup()
    finally:
        taken.close()


def test_a_metrics_address_in_use_ends_the_start_before_any_worker_is_touched(start_cgd, tmp_path: Path) -> None:
    root = tmp_path / "cgd"
    first = start_cgd("dgx-h100", root=root)
    status, reply = first.request("POST", "/v1/components", {"name": "svc", "claim": {"gpus": 1}, "command": WORKER})
    assert status == 201, reply
    wait_for(first.worker_pids, "the worker running")
    assert first.stop() == 0
    assert first.worker_pids() == [], "stopped with cgd: the next cgd must start it again"
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        busy = Cgd(root, "dgx-h100", ("--metrics-listen", f"127.0.0.1:{port}"))
        with pytest.raises(RuntimeError, match=f"metrics_listen 127.0.0.1:{port}"):
            busy.start(timeout=20)
        assert busy.proc is not None and busy.proc.returncode == 3
        assert f"cgd: error: metrics_listen 127.0.0.1:{port}" in busy.log()
        assert busy.worker_pids() == [], "nothing started and left running without a cgd"
        assert not busy.socket.exists(), "no socket left behind"
    finally:
        taken.close()
    again = start_cgd("dgx-h100", root=root)
    wait_for(again.worker_pids, "the next cgd starts the worker")
    assert again.request("GET", "/v1/components/svc")[1]["state"] == "running"


def follow(cgd: Cgd, into: list[dict[str, Any]], until: str) -> threading.Thread:
    """Follow the events in a thread until one of type `until` arrives."""
    def run() -> None:
        for event in CgdClient(cgd.socket).events():
            into.append(event)
            if event["type"] == until:
                return
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_events_follow_a_promotion_and_a_reconnect_misses_nothing(start_cgd, tmp_path: Path) -> None:
    cgd = start_cgd("dgx-h100", "--config", config(tmp_path))
    seen: list[dict[str, Any]] = []
    follower = follow(cgd, seen, until="promoted")
    wait_for(lambda: cgd.request("GET", "/v1/version")[1]["events"]["last_seq"] is not None, "cgd answers")
    shadow = promote(cgd)
    follower.join(timeout=20)
    assert not follower.is_alive(), [e["type"] for e in seen]
    kinds = [(e["type"], e.get("component")) for e in seen]
    assert kinds[:4] == [("allocated", "web"), ("worker_started", "web"),
                         ("allocated", "web-standby"), ("worker_started", "web-standby")], kinds
    exited = next(e for e in seen if e["type"] == "worker_exited")
    assert exited["component"] == "web" and exited["signal"] == "SIGKILL" and exited["exit_code"] is None
    assert exited["then"] == "promote" and exited["user"]
    assert kinds.index(("worker_exited", "web")) < kinds.index(("promoted", "web-standby"))
    seqs = [e["seq"] for e in seen]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert pids_of(cgd, "web-standby") == [shadow]

    # What happened since the last event seen is all there, and nothing before it.
    wait_for(lambda: any(e["type"] == "worker_started" and e["component"] == "web" and e["role"] == "shadow"
                         for e in CgdClient(cgd.socket).events(seen[-1]["seq"], follow=False)),
             "the old primary back as the shadow")
    later = list(CgdClient(cgd.socket).events(seen[-1]["seq"], follow=False))
    assert later and all(e["seq"] > seen[-1]["seq"] for e in later)
    every = list(CgdClient(cgd.socket).events(follow=False))
    assert [e["seq"] for e in every] == seqs + [e["seq"] for e in later], "nothing kept is missed"

    # A restarted cgd numbers on from where it was; a client from before is told what it missed.
    last = every[-1]["seq"]
    assert cgd.stop() == 0
    cgd.start()
    status, reply = cgd.request("POST", "/v1/components", {"name": "after", "claim": {"gpus": 1}})
    assert status == 201, reply
    again = list(CgdClient(cgd.socket).events(last, follow=False))
    assert again[0]["type"] == "gap" and again[0]["after"] == last and "restarted" in again[0]["message"]
    assert all(e["seq"] > last for e in again[1:])
    assert ("allocated", "after") in [(e["type"], e.get("component")) for e in again]


def test_cgctl_events(cgd: Cgd) -> None:
    status, reply = cgd.request("POST", "/v1/components", {
        "name": "job", "claim": {"gpus": 1}, "command": ["sh", "-c", "exit 3"], "restart": {"policy": "never"}})
    assert status == 201, reply
    wait_for(lambda: cgd.request("GET", "/v1/components/job")[1]["state"] == "failed", "the job failed")
    done = cgd.cgctl("events")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert [line.split(maxsplit=3)[3] for line in lines] == [
        "job allocated on GPU 0", f"job/0 started as primary (pid {lines[1].split()[-1][:-1]})",
        f"job/0 (pid {lines[1].split()[-1][:-1]}) ended: status 3; failed", "job failed"]
    as_json = [json.loads(line) for line in cgd.cgctl("events", "--json", "--since",
                                                      str(json.loads(cgd.cgctl("--json", "events").stdout
                                                                     .splitlines()[1])["seq"])).stdout.splitlines()]
    assert [e["type"] for e in as_json] == ["worker_exited", "failed"]
    assert as_json[0]["exit_code"] == 3 and as_json[0]["then"] == "fail"
    bad = cgd.cgctl("events", "--since", "soon")
    assert bad.returncode == 2 and "soon" in bad.stderr
    last = as_json[-1]["seq"]
    status, reply = cgd.request("GET", f"/v1/events?since={last + 1000}&follow=false")
    assert status == 400 and reply["error"]["message"] == (
        f"since: {last + 1000} is after the last event of this run ({last})"), reply
    status, reply = cgd.request("GET", "/v1/events?since=5&follow=false")
    assert status == 400 and "no event number of cgd" in reply["error"]["message"], reply


class Lines:
    """What a running command writes to one of its pipes, line by line, read as it comes."""

    def __init__(self, pipe: Any) -> None:
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(iter(pipe.readline, "")), daemon=True)
        self.reader.start()

    def until(self, check: Callable[[list[str]], object], what: str) -> list[str]:
        """The lines once `check` holds for them."""
        wait_for(lambda: check(self.lines), what, timeout=30)
        return list(self.lines)


@pytest.mark.parametrize("how", ["stop", "kill9"])
def test_cgctl_events_follow_reads_on_across_a_restart_of_cgd(cgd: Cgd, how: str) -> None:
    with subprocess.Popen([_executable("cgctl"), "events", "--follow"], env=cgd.env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as follower:
        out, err = Lines(follower.stdout), Lines(follower.stderr)
        try:
            follows_a_restart(cgd, how, follower, out, err)
        finally:
            follower.send_signal(signal.SIGINT)
            code = follower.wait(timeout=20)
            out.reader.join(timeout=20)
            err.reader.join(timeout=20)
        assert code == 0, err.lines  # Ctrl-C ends it as a person means it


def follows_a_restart(cgd: Cgd, how: str, follower: subprocess.Popen[str], out: Lines, err: Lines) -> None:
    """Follow, stop or kill cgd, start it again, allocate: the follower prints it."""
    status, reply = cgd.request("POST", "/v1/components", {"name": "before", "claim": {"gpus": 1}})
    assert status == 201, reply
    out.until(lambda lines: any("before allocated" in line for line in lines), "the follower sees `before`")
    last_shown = int(out.lines[-1].split()[1])

    if how == "stop":
        cgd.stop()
    else:
        cgd.kill9()
    err.until(lambda lines: lines, "a note that cgd went away")
    cgd.start()
    status, reply = cgd.request("POST", "/v1/components", {"name": "after", "claim": {"gpus": 1}})
    assert status == 201, reply
    lines = out.until(lambda lines: any("after allocated" in line for line in lines),
                      "the follower sees `after`, allocated once cgd was back")
    assert follower.poll() is None, "still following"
    after_restart = lines[[line.split()[1] for line in lines].index(str(last_shown)) + 1:]
    # cgd's new epoch: what the old run did not keep is told, nothing is shown twice
    assert "missed events: cgd restarted" in after_restart[0] and after_restart[0].split()[1] == "-"
    assert all(int(line.split()[1]) > last_shown for line in after_restart[1:])
    assert err.lines == [f"cgctl: cgd's events {'ended' if how == 'stop' else 'broke off'}; "
                         f"reconnecting to read after {last_shown}\n"]
    assert all(len(line.rstrip("\n")) <= 80 for line in lines + err.lines)


def test_every_metric_is_documented_and_the_dashboard_uses_real_ones(start_cgd, tmp_path: Path) -> None:
    cgd = start_cgd("dgx-h100", "--config", config(tmp_path))
    cgd.faults_file.write_text(json.dumps({"worker_memory_mib": {"0": 100}, "xid": [{"gpu": 1, "code": 79}]}))
    status, reply = cgd.request("POST", "/v1/components", {"name": "w", "claim": {"gpus": 1, "gpu_ids": [0]},
                                                           "command": WORKER})
    assert status == 201, reply
    wait_for(lambda: {"computegroups_worker_gpu_memory_used_bytes", "computegroups_gpu_health_events_total"}
             <= set(samples(scrape_unix(cgd))), "a worker measured, an Xid counted")
    found = samples(scrape_unix(cgd))
    exported = {re.sub(r"_(bucket|count|sum)$", "", name) for name in found}
    unlabelled = {name for name, series in found.items() for labels, _ in series
                  if labels.get("Hostname") != "dgx-h100-sim"}
    assert not unlabelled, f"one Host filter must pick every series: {sorted(unlabelled)}"
    root = Path(__file__).resolve().parents[3]
    documented = set(re.findall(r"^\| `(computegroups_\w+)`", (root / "docs/metrics.md").read_text(), re.M))
    assert exported == documented
    dashboard = (root / "contrib/grafana-dashboard.json").read_text()
    used = {re.sub(r"_(bucket|count|sum)$", "", n) for n in re.findall(r"computegroups_\w+", dashboard)}
    assert used - {"computegroups"} <= documented
    panels = json.loads(dashboard)["panels"]
    assert panels
    for target in (t for p in panels for t in p.get("targets", [])):
        for selector in re.findall(r"computegroups_\w+(\{[^}]*\})?", target["expr"]):
            assert 'Hostname=~"$host"' in selector, ("every panel follows the Host variable", target["expr"])


def test_ended_jobs_are_not_workers_expected_to_run(cgd: Cgd) -> None:
    """A job that completed or failed keeps its record a while, but no worker of it should run."""
    for name, code in (("done", 0), ("boom", 4)):
        status, reply = cgd.request("POST", "/v1/components", {
            "name": name, "claim": {"gpus": 1}, "command": ["sh", "-c", f"exit {code}"],
            "restart": {"max_retries": 0}})
        assert status == 201, reply
    status, reply = cgd.request("POST", "/v1/components", {"name": "w", "claim": {"gpus": 1}, "command": WORKER})
    assert status == 201, reply
    wait_for(lambda: [cgd.request("GET", f"/v1/components/{n}")[1]["state"] for n in ("done", "boom")]
             == ["completed", "failed"], "both jobs ended")
    wait_for(lambda: cgd.request("GET", "/v1/health")[1]["workers"]["running"] == 1, "w runs")
    assert cgd.request("GET", "/v1/health")[1]["workers"] == {"expected": 1, "running": 1}
    found = samples(scrape_unix(cgd))
    assert value(found, "computegroups_workers", state="expected") == 1
    assert value(found, "computegroups_workers", state="running") == 1


def test_a_queued_claim_is_placed_or_released_and_nothing_else(cgd: Cgd) -> None:
    """Placing a queued claim is one `placed` event (not `released` then `allocated`); a queued
    claim released before its turn is `released`, never `placed` on no GPU."""
    for body in ({"name": "holder", "claim": {"gpus": 8}},
                 {"name": "first", "claim": {"gpus": 8}, "wait": True, "detach": True},
                 {"name": "second", "claim": {"gpus": 8}, "wait": True, "detach": True}):
        status, reply = cgd.request("POST", "/v1/components", body)
        assert status == 201, reply
    done = cgd.cgctl("release", "holder")
    assert done.returncode == 0, done.stderr
    wait_for(lambda: cgd.request("GET", "/v1/components/first")[1]["state"] == "allocated", "first placed")
    done = cgd.cgctl("release", "--all")
    assert done.returncode == 0, done.stderr
    told = [(e["type"], e["component"], e.get("gpus")) for e in CgdClient(cgd.socket).events(follow=False)]
    assert [t for t in told if t[1] == "first"] == [
        ("queued", "first", None), ("placed", "first", list(range(8))), ("released", "first", None)], told
    assert [t for t in told if t[1] == "second"] == [("queued", "second", None), ("released", "second", None)], told


def test_worker_events_name_the_worker_pid(cgd: Cgd) -> None:
    """`allocate` and `list` show the worker's own pid; its events name the same one (and its
    launch shim's apart)."""
    status, reply = cgd.request("POST", "/v1/components", {
        "name": "w", "claim": {"gpus": 1}, "command": ["sleep", "600"], "restart": {"policy": "never"}})
    assert status == 201, reply
    (pid,) = reply["replicas"][0]["pids"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: cgd.request("GET", "/v1/components/w")[1]["state"] == "failed", "w failed")
    told = {e["type"]: e for e in CgdClient(cgd.socket).events(follow=False)}
    started, exited = told["worker_started"], told["worker_exited"]
    assert started["pid"] == exited["pid"] == pid and started["message"].endswith(f"(pid {pid})"), told
    assert started["shim_pid"] == exited["shim_pid"] != pid


def test_a_worker_start_is_never_told_after_its_end(cgd: Cgd, tmp_path: Path) -> None:
    """A restart whose launch shim ends before forking (the job removed its own cwd) has its exit
    handled while the start still waits for the fork: no start may be recorded after that."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    status, reply = cgd.request("POST", "/v1/components", {
        "name": "boom", "claim": {"gpus": 1}, "cwd": str(cwd), "command": ["sh", "-c", 'rmdir "$PWD"; exit 4'],
        "restart": {"max_retries": 1, "backoff_s": 0.01}})
    assert status == 201, reply
    wait_for(lambda: cgd.request("GET", "/v1/components/boom")[1]["state"] == "failed", "boom failed")
    wait_for(lambda: cgd.request("GET", "/v1/health")[1]["workers"] == {"expected": 0, "running": 0}, "no worker")
    told = [e["type"] for e in CgdClient(cgd.socket).events(follow=False) if e.get("component") == "boom"]
    assert told[-1] == "failed" and told.count("worker_started") == 1, told
    replica = cgd.request("GET", "/v1/components/boom")[1]["replicas"][0]
    assert replica["pids"] == [], replica


def test_reservations_groups_and_scaling_are_told(cgd: Cgd) -> None:
    """Every change a user makes shows in the stream, not only components: a reservation made,
    taken or left to expire, a group made on its own and deleted, a drain undone, a scale."""
    ok = [cgd.cgctl(*args) for args in (
        ("reserve", "night", "--gpus", "1"), ("allocate", "night", "--", "sleep", "60"),
        ("reserve", "brief", "--gpus", "1", "--ttl", "1s"), ("scale", "night", "--replicas", "2"))]
    assert all(done.returncode == 0 for done in ok), [done.stderr for done in ok]
    made = json.loads(cgd.cgctl("--json", "group", "create", "--memory", "1GiB").stdout)["id"]
    for args in (("group", "drain", made), ("group", "drain", made, "--undrain"), ("group", "delete", made)):
        assert cgd.cgctl(*args).returncode == 0, args

    def told() -> list[str]:
        return [e["message"] for e in CgdClient(cgd.socket).events(follow=False)
                if e["type"] in ("reserved", "unreserved", "scaled", "group_created", "group_deleted", "drained",
                                 "undrained")]
    wait_for(lambda: "reservation brief expired" in told(), "the short reservation expired")
    messages = told()
    assert [m for m in messages if "night" in m] == [
        messages[0], "reservation night taken by component night", "night scaled from 1 to 2 replicas"], messages
    assert messages[0].startswith("night reserved on GPU ")
    about_group = [m.split(":")[0] for m in messages if made in m]
    assert len(about_group) == 4 and about_group[0].startswith(f"group {made} made on GPU "), messages
    assert about_group[1:] == [f"group {made} draining", f"group {made} undrained", f"group {made} deleted"]
