"""Every cgctl command against a real cgd on a simulated dgx-h100, through the
installed `cgctl`, including the ways they fail."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_fixture import Cgd, _executable

pytestmark = pytest.mark.slow

NOT_RUNNING = "cgd is not running (no socket at {}): start it with `cgd` or `systemctl start computegroups`\n"


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout}s")


def ok(cgd: Cgd, *args: str) -> str:
    result = cgd.cgctl(*args)
    assert result.returncode == 0, (args, result.stdout, result.stderr, cgd.log())
    return result.stdout


def ok_json(cgd: Cgd, *args: str) -> Any:
    return json.loads(ok(cgd, "--json", *args))


def refused(cgd: Cgd, *args: str, code: int = 1) -> str:
    """The one-line error of a failing command."""
    result = cgd.cgctl(*args)
    assert result.returncode == code, (args, result.stdout, result.stderr)
    if code == 1:
        assert result.stderr.startswith("cgctl: error: ") and result.stderr.count("\n") == 1, result.stderr
    return result.stderr


def components(cgd: Cgd) -> dict[str, Any]:
    status, reply = cgd.request("GET", "/v1/components")
    assert status == 200
    return {c["name"]: c for c in reply["components"]}


def test_daemon_down(tmp_path: Path) -> None:
    missing = tmp_path / "cgd.sock"
    for args in (["list"], ["status"], ["allocate", "web", "--gpus", "1"], ["run", "--gpus", "1", "--", "true"]):
        result = subprocess.run([_executable("cgctl"), "--socket", str(missing), *args],
                                capture_output=True, text=True, timeout=30, check=False)
        assert result.returncode == 1 and result.stderr == "cgctl: error: " + NOT_RUNNING.format(missing)


def test_allocate_list_env_release(cgd: Cgd) -> None:
    doc = ok_json(cgd, "allocate", "web", "--gpus", "2", "--colocate", "nvlink")
    assert doc["name"] == "web"
    (replica,) = doc["replicas"]
    assert replica["index"] == 0 and replica["group"] == "web-0" and replica["role"] == "primary"
    assert replica["pids"] == []
    indices = [d["index"] for d in replica["devices"]]
    assert len(indices) == 2 and all(d["uuid"].startswith("GPU-") for d in replica["devices"])
    assert replica["cuda_visible_devices"] == ",".join(map(str, indices))

    table = ok(cgd, "list").splitlines()
    assert table[0].split()[0] == "NAME" and table[1].split()[:4] == ["web", "0", "web-0", "primary"]
    assert ok_json(cgd, "list")["components"][0]["owner"]["uid"] == os.getuid()

    exports = ok(cgd, "env", "web").splitlines()
    assert f"export CUDA_VISIBLE_DEVICES={replica['cuda_visible_devices']}" in exports
    assert "export CG_COMPONENT=web" in exports
    assert not [e for e in exports if not e.startswith(("export CUDA_", "export CG_"))], exports

    assert ok(cgd, "release", "web") == "released web (groups web-0)\n"
    assert components(cgd) == {}
    assert "nothing allocated" in ok(cgd, "list")


def test_affinity_and_anti_affinity_see_a_component_allocated_a_moment_ago(cgd: Cgd) -> None:
    """The second command places against the first one's group at once, not after a restart."""

    def gpus(doc: dict[str, Any]) -> set[int]:
        return {d["index"] for r in doc["replicas"] for d in r["devices"]}

    db = gpus(ok_json(cgd, "allocate", "db", "--memory", "1GiB", "--strategy", "spread"))
    assert gpus(ok_json(cgd, "allocate", "cache", "--memory", "1GiB", "--strategy", "spread",
                        "--affinity", "db")) == db
    assert not gpus(ok_json(cgd, "allocate", "other", "--memory", "1GiB", "--strategy", "binpack",
                            "--anti-affinity", "db")) & db
    error = refused(cgd, "allocate", "typo", "--memory", "1GiB", "--affinity", "dbb")
    assert error == "cgctl: error: claim.affinity[0]: no component named 'dbb': `cgctl list` shows what exists\n"
    assert "typo" not in components(cgd)


@pytest.mark.parametrize("size, mib", [("20GiB", 20480), ("512MiB", 512), ("20G", 20480)])
def test_shares_take_the_sizes_people_write(cgd: Cgd, size: str, mib: int) -> None:
    doc = ok_json(cgd, "allocate", "part", "--memory", size, "--compute", "30")
    (device,) = doc["replicas"][0]["devices"]
    assert (device["memory_mib"], device["compute_pct"]) == (mib, 30)


def test_bad_size_is_a_usage_error_and_allocates_nothing(cgd: Cgd) -> None:
    refused(cgd, "allocate", "web", "--memory", "20Q", code=2)
    refused(cgd, "allocate", "web", "--memory", "20GiB", "--gpus", "1", code=2)
    assert components(cgd) == {}


def test_unknown_component(cgd: Cgd) -> None:
    for args in (["release", "ghost"], ["scale", "ghost", "--replicas", "2"], ["env", "ghost"], ["logs", "ghost"]):
        assert "ghost" in refused(cgd, *args), args


def test_capacity_exhausted_and_never_fits(cgd: Cgd) -> None:
    ok(cgd, "allocate", "big", "--gpus", "8")
    full = refused(cgd, "allocate", "more", "--gpus", "1")
    never = refused(cgd, "allocate", "huge", "--gpus", "64")
    assert full != never
    assert set(components(cgd)) == {"big"}


def test_allocate_with_a_command_runs_it_and_logs_follow(cgd: Cgd, tmp_path: Path) -> None:
    script = ("for i in 1 2 3; do echo line $i; echo oops >&2; done; "
              "while [ ! -e go ]; do sleep 0.05; done; echo later; sleep 60")
    doc = ok_json(cgd, "allocate", "talker", "--gpus", "1", "--cwd", str(tmp_path), "--", "sh", "-c", script)
    assert doc["replicas"][0]["group"] == "talker-0"
    wait_for(lambda: components(cgd)["talker"]["replicas"][0]["pids"])
    wait_for(lambda: "line 3" in ok(cgd, "logs", "talker"))
    assert ok(cgd, "logs", "talker", "--tail", "1") == "line 3\n"
    assert "oops" in ok(cgd, "logs", "talker", "--stream", "stderr")
    assert ok_json(cgd, "logs", "talker")["data"] == "line 1\nline 2\nline 3\n"

    follower = subprocess.Popen([_executable("cgctl"), "logs", "talker", "-f"], env=cgd.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert follower.stdout is not None and follower.stderr is not None
    try:
        seen = [follower.stdout.readline() for _ in range(3)]
        (tmp_path / "go").touch()
        seen.append(follower.stdout.readline())
        ok(cgd, "release", "talker")
        follower.wait(timeout=20)
    finally:
        follower.kill()
    assert seen == ["line 1\n", "line 2\n", "line 3\n", "later\n"]
    assert follower.returncode == 0 and "talker is gone" in follower.stderr.read()
    follower.stdout.close()
    follower.stderr.close()


def test_scale_out_and_in(cgd: Cgd) -> None:
    ok(cgd, "allocate", "web", "--gpus", "1", "--replicas", "2")
    doc = ok_json(cgd, "scale", "web", "--replicas", "3")
    assert [r["group"] for r in doc["replicas"]] == ["web-0", "web-1", "web-2"]
    assert ok(cgd, "scale", "web", "--replicas", "1").startswith("scaled web: 1 replica ")
    _, groups = cgd.request("GET", "/v1/groups?component=web")
    assert [g["id"] for g in groups["groups"]] == ["web-0"]


def test_status_drain_and_undrain(cgd: Cgd) -> None:
    ok(cgd, "allocate", "web", "--gpus", "1", "--gpu-ids", "0")
    text = ok(cgd, "status", "--long")
    assert text.startswith("8 GPUs: 1 in use, 0 drained")
    gpu0 = text.split("\n\n")[1]
    assert gpu0.startswith("GPU 0") and "on it: web" in gpu0 and "mem [" in gpu0 and "sm  [" in gpu0
    assert "\x1b[" not in text

    drained = ok_json(cgd, "drain", "3")
    assert drained == {"gpu": 3, "drained": True, "groups": []}
    assert "DRAINED" in ok(cgd, "status", "--long").split("\n\n")[4]
    assert ok_json(cgd, "status")["gpus"][3]["drained"] is True
    refused(cgd, "allocate", "pinned", "--gpus", "1", "--gpu-ids", "3")
    assert "undrained" in ok(cgd, "drain", "3", "--undrain")
    ok(cgd, "allocate", "pinned", "--gpus", "1", "--gpu-ids", "3")
    assert "no GPU 99" in refused(cgd, "drain", "99")


def test_explain_says_why(cgd: Cgd) -> None:
    lines = ok(cgd, "allocate", "web", "--gpus", "2", "--explain").splitlines()
    why = next(i for i, line in enumerate(lines) if line.startswith("why: "))
    assert len(" ".join(lines[why:])) > len("why: ") + 10
    assert all(len(line) <= 80 for line in lines[why:]), "the explanation is wrapped for a terminal"


def test_reserve_then_allocate_takes_it(cgd: Cgd) -> None:
    reservation = ok_json(cgd, "reserve", "train", "--gpus", "2", "--ttl", "10m")
    held = sorted(d["index"] for g in reservation["groups"] for d in g["devices"])
    listed = ok(cgd, "list")
    assert "RESERVATION" in listed and "train" in listed
    doc = ok_json(cgd, "allocate", "train")
    assert sorted(d["index"] for d in doc["replicas"][0]["devices"]) == held
    assert ok_json(cgd, "list")["reservations"] == []


def test_reservation_expires(cgd: Cgd) -> None:
    ok(cgd, "reserve", "brief", "--gpus", "1", "--ttl", "1s")
    wait_for(lambda: not cgd.request("GET", "/v1/reservations")[1]["reservations"], timeout=30)


def test_release_of_a_reservation_and_all(cgd: Cgd) -> None:
    ok(cgd, "reserve", "held", "--gpus", "1")
    ok(cgd, "allocate", "a", "--gpus", "1")
    ok(cgd, "allocate", "b", "--share-with", "a")
    assert ok(cgd, "release", "held").startswith("released held")
    assert cgd.request("GET", "/v1/reservations")[1]["reservations"] == []
    doc = ok_json(cgd, "release", "--all")
    assert sorted(doc["released"]) == ["a", "b"]
    assert components(cgd) == {}


def test_release_of_several_names_checks_them_all_first(cgd: Cgd) -> None:
    ok(cgd, "allocate", "a", "--gpus", "1", "--", "sleep", "60")
    ok(cgd, "allocate", "b", "--gpus", "1", "--", "sleep", "60")
    ok(cgd, "allocate", "c", "--gpus", "1")
    ok(cgd, "allocate", "c-user", "--share-with", "c")
    ok(cgd, "reserve", "held", "--gpus", "1")
    pids = {p for name in ("a", "b") for r in components(cgd)[name]["replicas"] for p in r["pids"]}

    assert "'typo'" in refused(cgd, "release", "a", "typo", "b")
    for query in ("", "?all=true&name=a", "?name=a&name=b&stop_timeout=-1", "?all=true&stop_timeout=1"):
        assert cgd.request("DELETE", f"/v1/components{query}")[0] == 400, query
    assert "release it first" in refused(cgd, "release", "a", "c", "b")
    assert set(components(cgd)) == {"a", "b", "c", "c-user"}
    assert all(components(cgd)[n]["state"] == "running" for n in ("a", "b"))
    assert all(_alive(pid) for pid in pids)

    doc = ok_json(cgd, "release", "a", "held", "b", "a")
    assert sorted(doc["released"]) == ["a", "b"] and doc["reservations"] == ["held"]
    assert sorted(doc["groups"]) == ["a-0", "b-0", "held-0"]
    assert set(components(cgd)) == {"c", "c-user"}
    assert cgd.request("GET", "/v1/reservations")[1]["reservations"] == []
    wait_for(lambda: not any(_alive(pid) for pid in pids))
    assert ok(cgd, "release", "c-user", "c").startswith("released c-user, c")


def test_env_is_refused_for_a_component_without_devices(cgd: Cgd) -> None:
    """`eval "$(cgctl env NAME)"` must not go on with an empty CUDA_VISIBLE_DEVICES."""
    ok(cgd, "allocate", "hog", "--gpus", "8")
    ok(cgd, "allocate", "queued", "--gpus", "1", "--detach", "--", "true")
    assert "'queued' is queued and holds no devices yet" in refused(cgd, "env", "queued")
    ok(cgd, "release", "hog")
    wait_for(lambda: components(cgd)["queued"]["state"] == "completed")
    assert "'queued' has ended (completed)" in refused(cgd, "env", "queued")


def test_share_with_uses_the_same_devices(cgd: Cgd) -> None:
    first = ok_json(cgd, "allocate", "a", "--memory", "20GiB")
    second = ok_json(cgd, "allocate", "b", "--share-with", "a")
    assert second["replicas"][0]["devices"] == first["replicas"][0]["devices"]
    assert "release it first" in refused(cgd, "release", "a")


def test_run_passes_the_devices_and_the_exit_status(cgd: Cgd, tmp_path: Path) -> None:
    result = cgd.cgctl("run", "--gpus", "2", "--env", "EXTRA=1", "--",
                       "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES $CG_COMPONENT $EXTRA $PWD"; exit 7')
    assert result.returncode == 7, (result.stdout, result.stderr)
    visible, component, extra, cwd = result.stdout.split()
    assert len(visible.split(",")) == 2 and component.startswith("run-") and extra == "1"
    assert cwd == os.getcwd()
    assert components(cgd) == {}


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_run_interrupted_releases_and_exits_128_plus_signal(cgd: Cgd, signame: str) -> None:
    proc = subprocess.Popen([_executable("cgctl"), "run", "--name", "job", "--gpus", "1", "--", "sleep", "60"],
                            env=cgd.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: "job" in components(cgd) and _children(proc.pid))
        proc.send_signal(getattr(signal, signame))
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + getattr(signal, signame), err
    assert components(cgd) == {}


def test_run_killed_cgctl_leaves_nothing_behind(cgd: Cgd) -> None:
    """The lease: cgd frees what a SIGKILLed `cgctl run` held."""
    proc = subprocess.Popen([_executable("cgctl"), "run", "--name", "lease", "--gpus", "1", "--", "sleep", "60"],
                            env=cgd.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        wait_for(lambda: "lease" in components(cgd) and _children(proc.pid))
        proc.kill()
        proc.wait(timeout=10)
        wait_for(lambda: "lease" not in components(cgd), timeout=30)
        assert not _session_alive(proc.pid), "the orphaned command went with the lease"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_run_leaves_nothing_of_its_command_running_after_the_release(cgd: Cgd, tmp_path: Path) -> None:
    """What CMD backgrounded, in its own session too (setsid), ends before `cgctl run` returns."""
    pids = tmp_path / "pids"
    result = cgd.cgctl("run", "--gpus", "1", "--", "sh", "-c",
                       f"sleep 300 & echo $! >> {pids}; setsid sleep 300 & echo $! >> {pids}; exit 3")
    assert result.returncode == 3, result.stderr
    left = [int(p) for p in pids.read_text().split()]
    assert len(left) == 2
    assert not [p for p in left if _alive(p)], f"still running: {[p for p in left if _alive(p)]}"
    assert components(cgd) == {}


def test_run_command_survives_a_restart_of_cgd(cgd: Cgd, tmp_path: Path) -> None:
    """cgd restarted under a running `cgctl run`: the command is no stray to stop; the lease holds."""
    pid_file = tmp_path / "pid"
    proc = subprocess.Popen([_executable("cgctl"), "run", "--name", "held", "--gpus", "1", "--",
                             "sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"],
                            env=cgd.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        command = wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() and int(pid_file.read_text()))
        cgd.kill9()
        cgd.start()
        assert "held" in components(cgd) and _alive(command), cgd.log()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    assert components(cgd) == {} and not _alive(command)


def _alive(pid: int) -> bool:
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def _session_alive(sid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                return True
    return False


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


# Someone else's component: cgctl must run as another uid. The interpreter lives
# where that uid cannot read, so a root Python imports cgctl and its commands
# (which cgctl itself loads only when one runs), then drops to nobody.
AS_NOBODY = textwrap.dedent("""
    import os, sys
    import click
    from computegroups.cli.main import COMMANDS, cli
    with click.Context(cli) as ctx:
        for name in COMMANDS:
            cli.get_command(ctx, name)
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
    cli(sys.argv[1:], prog_name="cgctl")
""")


# The same, for a component of nobody's own, made through the client (the allocate command's
# imports would be read after the drop).
NOBODY_ALLOCATES = textwrap.dedent("""
    import os, sys
    from computegroups.daemon.client.sync import CgdClient
    client = CgdClient(sys.argv[1])
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
    client.create_component({"name": sys.argv[2], "claim": {"gpus": 1}})
""")


@pytest.fixture
def shared_cgd(start_cgd: Callable[..., Cgd]) -> Iterator[Cgd]:
    """A daemon whose socket another uid can reach."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as a second user")
    root = Path(tempfile.mkdtemp(prefix="cg-e2e-"))
    root.chmod(0o755)
    try:
        cgd = start_cgd("dgx-h100", root=root)
        cgd.socket.chmod(0o666)
        yield cgd
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_someone_elses_component_is_refused(shared_cgd: Cgd) -> None:
    ok(shared_cgd, "allocate", "mine", "--gpus", "1")
    env = {**shared_cgd.env(), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for args in (["release", "mine"], ["scale", "mine", "--replicas", "2"], ["env", "mine"]):
        result = subprocess.run([sys.executable, "-c", AS_NOBODY, *args], env=env,
                                capture_output=True, text=True, timeout=30, check=False)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert result.stderr.startswith("cgctl: error: ") and "belongs to" in result.stderr, result.stderr
    assert "mine" in components(shared_cgd)


def test_a_release_naming_someone_elses_reservation_releases_nothing(shared_cgd: Cgd) -> None:
    ok(shared_cgd, "reserve", "theirs", "--gpus", "1")
    env = {**shared_cgd.env(), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

    def as_nobody(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", AS_NOBODY, *args], env=env,
                              capture_output=True, text=True, timeout=30, check=False)

    made = subprocess.run([sys.executable, "-c", NOBODY_ALLOCATES, str(shared_cgd.socket), "own"], env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    assert made.returncode == 0, made.stderr
    result = as_nobody("release", "own", "theirs")
    assert result.returncode == 1 and "belongs to" in result.stderr and result.stderr.count("\n") == 1, result
    assert "own" in components(shared_cgd)
    assert [r["name"] for r in shared_cgd.request("GET", "/v1/reservations")[1]["reservations"]] == ["theirs"]
    assert as_nobody("release", "own").returncode == 0


def test_topo_shows_the_machine_the_running_cgd_serves(cgd: Cgd) -> None:
    """No driver here and no --simulate: cgctl asks cgd, which serves a simulated dgx-h100."""
    served = ok_json(cgd, "topo")
    assert served["source"] == "simulated:dgx-h100" and len(served["gpus"]) == 8
    assert ok(cgd, "topo").splitlines()[0].startswith("dgx-h100-sim (simulated:dgx-h100)")
    local = cgd.cgctl("topo", "--local", env={"CG_SIMULATE": "workstation-4x-pcie"})
    assert local.returncode == 0 and "simulated:workstation-4x-pcie" in local.stdout


def test_a_command_that_cannot_start_is_refused_and_nothing_is_allocated(cgd: Cgd) -> None:
    cases = {
        "/nonexistent/prog": "command[0]: /nonexistent/prog: not found",
        "/etc/passwd": "command[0]: /etc/passwd is not executable",
        "nosuchcommand-xyz": "command[0]: 'nosuchcommand-xyz' on the worker's PATH (",
    }
    for program, message in cases.items():
        error = refused(cgd, "allocate", "job", "--gpus", "1", "--", program)
        assert error.startswith(f"cgctl: error: {message}"), error
    assert components(cgd) == {}


def test_json_may_follow_the_command_name_but_never_crosses_into_the_workers_command(cgd: Cgd) -> None:
    ok(cgd, "allocate", "web", "--memory", "1GiB")
    assert [c["name"] for c in json.loads(ok(cgd, "list", "--json"))["components"]] == ["web"]
    said = ok(cgd, "run", "--memory", "1GiB", "--", sys.executable, "-c", "import sys; print(sys.argv[1:])",
              "--json")
    assert said.strip() == "['--json']"



def test_status_names_a_group_of_its_own_and_group_create_explains(cgd: Cgd) -> None:
    """Its memory counts as claimed, so the GPU line says whose it is: `group.N:group`, until a
    component uses it (then the component is named)."""
    made = ok(cgd, "group", "create", "--memory", "2GiB", "--explain")
    gid = made.split()[1]
    assert made.splitlines()[2].startswith("why: ") and all(len(line) <= 80 for line in made.splitlines()), made
    gpu = ok_json(cgd, "group", "list")["groups"][0]["devices"][0]["index"]
    line = next(text for text in ok(cgd, "status").splitlines() if text.lstrip().startswith(f"{gpu} "))
    assert line.endswith(f"{gid}:group"), line
    listed = ok(cgd, "group", "list").splitlines()
    assert listed[1].split()[:2] == [gid, "allocated"] and listed[1].split()[2].startswith(f"{gpu}[2GiB"), listed
