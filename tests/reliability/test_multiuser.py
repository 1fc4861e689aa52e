"""Two local users on one cgd: neither may touch the other's components, and
each one's workers run as that user.

cgd runs as root here, so it is in system mode: its socket is 0660 with the
group `computegroups`. The test creates a user (and the group when it is
missing), removes both afterwards, and is skipped when it is not root or
`useradd` is missing. The second user talks to cgd from a forked child that
has dropped to that user's ids: SO_PEERCRED, which cgd trusts, sees exactly
what it would see from that user's own shell. In the last test `cgctl`
itself runs as that user (see `cgctl_for` for a Python under a 0700 /root).
"""

from __future__ import annotations

import grp
import http.client
import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_fixture import Cgd, _executable

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="creating a second user needs root"),
    pytest.mark.skipif(shutil.which("useradd") is None, reason="useradd is not installed"),
]

USER = "cgtest"
GROUP = "computegroups"
SLEEP = [shutil.which("sleep") or "/bin/sleep", "600"]


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    def request(self, cgd: Cgd, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return as_user(self, lambda: cgd.request(method, path, body))


def as_user(user: User, action: Callable[[], Any]) -> Any:
    """`action()` in a forked child that became `user`; its result (JSON) or its exception comes back."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.setgroups(list(user.groups))
            os.setgid(user.gid)
            os.setuid(user.uid)
            try:
                payload = {"result": action()}
            except (OSError, http.client.HTTPException) as exc:
                payload = {"error": f"{type(exc).__name__}: {exc}", "type": type(exc).__name__}
            os.write(write_end, json.dumps(payload).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    payload = json.loads(data)
    if "error" in payload:
        raise PermissionError(payload["error"]) if payload["type"] == "PermissionError" else RuntimeError(
            payload["error"])
    result = payload["result"]
    return tuple(result) if isinstance(result, list) else result


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@pytest.fixture
def second_user() -> Iterator[User]:
    made_group = False
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        _run("groupadd", "--system", GROUP)
        made_group = True
    try:
        pwd.getpwnam(USER)
        _run("userdel", "-r", USER)
    except KeyError:
        pass
    _run("useradd", "--create-home", "--shell", "/bin/sh", "--groups", GROUP, USER)
    try:
        entry = pwd.getpwnam(USER)
        yield User(USER, entry.pw_uid, entry.pw_gid, (entry.pw_gid, grp.getgrnam(GROUP).gr_gid))
    finally:
        subprocess.run(["pkill", "-KILL", "-u", USER], capture_output=True, timeout=30, check=False)
        subprocess.run(["userdel", "-r", USER], capture_output=True, timeout=30, check=False)
        if made_group:
            subprocess.run(["groupdel", GROUP], capture_output=True, timeout=30, check=False)


@pytest.fixture
def shared_cgd(start_cgd: Callable[..., Cgd], second_user: User) -> Iterator[Cgd]:
    """A cgd whose socket directory other users can reach (pytest's own tmp root is 0700)."""
    root = Path(tempfile.mkdtemp(prefix="cg-multi-"))
    root.chmod(0o755)
    cgd = None
    try:
        cgd = start_cgd("dgx-h100", root=root)
        yield cgd
    finally:
        if cgd is not None:
            cgd.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def wait_for_pid(cgd: Cgd, name: str, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, reply = cgd.request("GET", f"/v1/components/{name}")
        if status == 200 and reply["replicas"][0]["pids"]:
            pid = reply["replicas"][0]["pids"][0]
            if Path(f"/proc/{pid}/exe").resolve().name == "sleep":
                return pid
        time.sleep(0.05)
    raise AssertionError(f"{name} has no running worker after {timeout}s")


def ids(pid: int) -> tuple[int, int]:
    """Real uid and gid of a process, from the kernel."""
    fields = {line.split(":")[0]: line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
              if line.startswith(("Uid:", "Gid:"))}
    return int(fields["Uid"]), int(fields["Gid"])


def test_socket_admits_the_group_only(shared_cgd: Cgd, second_user: User) -> None:
    mode = shared_cgd.socket.stat()
    assert stat.S_IMODE(mode.st_mode) == 0o660 and mode.st_gid == grp.getgrnam(GROUP).gr_gid
    assert second_user.request(shared_cgd, "GET", "/v1/version")[0] == 200
    outsider = User(USER, second_user.uid, second_user.gid, (second_user.gid,))
    with pytest.raises(PermissionError):
        outsider.request(shared_cgd, "GET", "/v1/version")


def test_second_user_cannot_touch_anothers_component(shared_cgd: Cgd, second_user: User) -> None:
    cgd = shared_cgd
    status, reply = cgd.request("POST", "/v1/components", {"name": "roots", "claim": {"gpus": 1}, "command": SLEEP,
                                                           "replicas": 1, "env": {"SECRET": "s3cret"}})
    assert status == 201, reply
    wait_for_pid(cgd, "roots")
    before = cgd.state()
    refused = {
        "release": ("DELETE", "/v1/components/roots", None),
        "scale": ("POST", "/v1/components/roots/scale", {"replicas": 2}),
        "logs": ("GET", "/v1/components/roots/logs", None),
        "stderr": ("GET", "/v1/components/roots/logs?stream=stderr&tail=10", None),
        "env": ("GET", "/v1/components/roots/env", None),
        "shadow": ("POST", "/v1/components", {"name": "spy", "shadow_of": "roots", "command": SLEEP}),
        "share": ("POST", "/v1/components", {"name": "spy", "share_with": "roots"}),
        "drain its group": ("POST", "/v1/groups/roots-0/drain", None),
    }
    for what, (method, path, body) in refused.items():
        status, reply = second_user.request(cgd, method, path, body)
        assert status == 403 and reply["error"]["code"] == "forbidden", (what, status, reply)
        assert "s3cret" not in json.dumps(reply), what
    assert cgd.state() == before, "a refused request changed the state"
    assert cgd.request("GET", "/v1/components/roots")[1]["replicas_wanted"] == 1


def test_second_users_workers_run_as_themselves(shared_cgd: Cgd, second_user: User) -> None:
    cgd = shared_cgd
    status, reply = second_user.request(cgd, "POST", "/v1/components", {
        "name": "theirs", "claim": {"memory_mib": 4096}, "command": [*SLEEP], "replicas": 2})
    assert status == 201, reply
    assert reply["owner"]["uid"] == second_user.uid and reply["owner"]["user"] == USER
    pid = wait_for_pid(cgd, "theirs")
    assert ids(pid) == (second_user.uid, second_user.gid)
    out = cgd.log_dir / "theirs" / "0.out"
    assert out.stat().st_uid == second_user.uid, "its log file is its own"
    assert second_user.request(cgd, "GET", "/v1/components/theirs/logs")[0] == 200
    status, reply = second_user.request(cgd, "POST", "/v1/components/theirs/scale", {"replicas": 1})
    assert status == 200 and reply["replicas_wanted"] == 1, reply
    # Root administers the machine: it may release anyone's component.
    status, reply = cgd.request("DELETE", "/v1/components/theirs")
    assert status == 200 and reply["released"] == ["theirs"], reply


def cgctl_for(user: User, scratch: Path) -> list[str]:
    """A cgctl command line `user` can run.

    The installed one, where this Python is reachable by the user. Otherwise
    (a Python under a 0700 /root) a copy: cgctl needs only click, msgspec
    (the model of a claim) and this project's own packages, put in a
    world-readable directory and run by a system Python of the same version
    (msgspec's extension module is built for it).
    """
    def runs(argv: list[str], env: dict[str, str] | None = None) -> bool:
        try:
            subprocess.run(argv, user=user.uid, group=user.gid, extra_groups=list(user.groups), env=env,
                           capture_output=True, timeout=30, check=True, cwd="/tmp")
        except (OSError, subprocess.SubprocessError):
            return False
        return True

    if runs([sys.executable, "-c", "import click"]):
        return [_executable("cgctl")]
    import click
    import msgspec

    root = Path(__file__).parents[2]
    tree = scratch / "cgctl"
    shutil.copytree(root / "daemon" / "root", tree / "computegroups", ignore=shutil.ignore_patterns("__pycache__"))
    for package in ("cli", "daemon", "topology", "statefiles"):
        shutil.copytree(root / package, tree / "computegroups" / package, ignore=shutil.ignore_patterns("__pycache__"))
    for library in (click, msgspec):
        assert library.__file__ is not None, library
        shutil.copytree(Path(library.__file__).parent, tree / library.__name__,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for path in (scratch, *tree.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for python in (shutil.which(version, path="/usr/local/bin:/usr/bin"), shutil.which("python3", path="/usr/bin")):
        argv = [python or "", "-c", f"import sys; sys.path.insert(0, {str(tree)!r}); "
                "sys.argv[0] = 'cgctl'; from computegroups.cli.main import main; main()"]
        if python and runs([*argv, "--help"], env={"PATH": "/usr/bin:/bin"}):
            return argv
    pytest.skip(f"neither {sys.executable} nor a system {version} can be run by {USER}")


def test_cgctl_as_second_user(shared_cgd: Cgd, second_user: User) -> None:
    """The command line's own refusal, run as the second user."""
    scratch = Path(tempfile.mkdtemp(prefix="cgctl-", dir="/tmp"))
    try:
        _cgctl_as_second_user(shared_cgd, second_user, cgctl_for(second_user, scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _cgctl_as_second_user(cgd: Cgd, second_user: User, cgctl: list[str]) -> None:
    assert cgd.request("POST", "/v1/components", {"name": "roots", "claim": {"gpus": 1}})[0] == 201
    env = {**cgd.env(), "HOME": f"/home/{USER}"}
    done = subprocess.run([*cgctl, "release", "roots"], user=second_user.uid, group=second_user.gid,
                          extra_groups=list(second_user.groups), env=env, capture_output=True, text=True,
                          timeout=30, cwd="/tmp", check=False)
    assert done.returncode == 1 and "cgctl: error:" in done.stderr and "only its owner" in done.stderr, done
    assert "component 'roots' belongs to root;" in done.stderr, "a shared box names people, not uids"
    done = subprocess.run([*cgctl, "allocate", "mine", "--memory", "1GiB", "--", *SLEEP],
                          user=second_user.uid, group=second_user.gid, extra_groups=list(second_user.groups),
                          env=env, capture_output=True, text=True, timeout=30, cwd="/tmp", check=False)
    assert done.returncode == 0, done
    assert ids(wait_for_pid(cgd, "mine")) == (second_user.uid, second_user.gid)


def test_cwd_and_command_are_checked_as_the_asking_user(shared_cgd: Cgd, second_user: User) -> None:
    """What only root may enter or run is refused to the user, as their own start would fail."""
    private = Path(tempfile.mkdtemp(prefix="cg-private-"))
    private.chmod(0o700)
    tool = private / "tool"
    tool.write_text("#!/bin/sh\nsleep 600\n")
    tool.chmod(0o700)
    try:
        for body, message in (
            ({"cwd": str(private)}, f"cwd: {private}: permission denied"),
            ({"command": [str(tool)]}, f"command[0]: {tool}: not found"),
        ):
            status, reply = second_user.request(shared_cgd, "POST", "/v1/components", {
                "name": "snoop", "claim": {"memory_mib": 1024}, "command": [*SLEEP], **body})
            assert status == 400 and reply["error"]["message"] == message, reply
        assert shared_cgd.request("POST", "/v1/components", {
            "name": "mine", "claim": {"memory_mib": 1024}, "command": [str(tool)], "cwd": str(private)})[0] == 201
    finally:
        shutil.rmtree(private, ignore_errors=True)


@pytest.fixture
def limited_cgd(start_cgd: Callable[..., Cgd], second_user: User) -> Iterator[Cgd]:
    """A cgd the second user can reach, with per-user limits small enough to reach in a test."""
    root = Path(tempfile.mkdtemp(prefix="cg-limits-"))
    root.chmod(0o755)
    config = root / "cgd.toml"
    config.write_text("[limits]\npending_per_user = 2\nconnections_per_user = 2\n")
    config.chmod(0o644)
    cgd = None
    try:
        cgd = start_cgd("dgx-h100", "--config", str(config), root=root)
        yield cgd
    finally:
        if cgd is not None:
            cgd.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def queue(cgd: Cgd, name: str, user: User | None = None) -> tuple[int, Any]:
    """Queue a claim for all 8 GPUs that stays queued when its (short-lived) client goes."""
    body = {"name": name, "claim": {"gpus": 8}, "wait": True, "detach": True}
    return user.request(cgd, "POST", "/v1/components", body) if user else cgd.request("POST", "/v1/components", body)


def test_one_user_may_queue_only_so_many_claims(limited_cgd: Cgd, second_user: User) -> None:
    cgd = limited_cgd
    assert cgd.request("POST", "/v1/components", {"name": "all", "claim": {"gpus": 8}})[0] == 201
    for name in ("r0", "r1", "r2"):  # root has no limit, and its claims count against nobody else
        status, reply = queue(cgd, name)
        assert status == 201 and reply["state"] == "pending", reply
    for name in ("u0", "u1"):
        status, reply = queue(cgd, name, second_user)
        assert status == 201 and reply["state"] == "pending", reply
    status, reply = queue(cgd, "u2", second_user)
    assert status == 429 and reply["error"]["code"] == "limit_reached", reply
    assert reply["error"]["message"] == (f"{USER} has 2 claims queued, the most one user may have "
                                         "(limits.pending_per_user = 2): cancel some or wait for them to start")
    assert "u2" not in cgd.state()["components"]
    assert cgd.request("DELETE", "/v1/components/u0")[0] == 200  # one leaves the queue: room for another
    status, reply = queue(cgd, "u2", second_user)
    assert status == 201 and reply["state"] == "pending", reply


def third_connection(path: Path) -> str:
    """Hold two idle connections to cgd and return what it answers on a third."""
    held = []
    try:
        for _ in range(3):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(10)
            sock.connect(str(path))
            held.append(sock)
        chunks = []
        while chunk := held[-1].recv(65536):
            chunks.append(chunk)
        return b"".join(chunks).decode()
    finally:
        for sock in held:
            sock.close()


def test_connections_over_the_per_user_cap_are_refused_but_not_roots(limited_cgd: Cgd, second_user: User) -> None:
    answer = as_user(second_user, lambda: third_connection(limited_cgd.socket))
    assert answer.startswith("HTTP/1.1 503 "), answer
    assert f"too many connections from uid {second_user.uid} (2 open)" in answer, answer
    roots = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(5)]
    try:
        for sock in roots:
            sock.connect(str(limited_cgd.socket))
        assert limited_cgd.request("GET", "/v1/version")[0] == 200  # the sixth of root's connections
    finally:
        for sock in roots:
            sock.close()
    assert second_user.request(limited_cgd, "GET", "/v1/version")[0] == 200


def test_a_user_sees_their_own_events_and_the_machines_only(shared_cgd: Cgd, second_user: User) -> None:
    cgd = shared_cgd
    status, reply = cgd.request("POST", "/v1/components", {"name": "roots", "claim": {"gpus": 1}, "command": SLEEP})
    assert status == 201, reply
    status, reply = second_user.request(cgd, "POST", "/v1/components", {
        "name": "theirs", "claim": {"memory_mib": 4096}, "command": SLEEP})
    assert status == 201, reply
    assert cgd.request("POST", "/v1/gpus/7/drain")[0] == 200

    def events(status_and_body: tuple[int, Any]) -> list[dict[str, Any]]:
        status, body = status_and_body
        assert status == 200, body
        text = body if isinstance(body, str) else json.dumps(body)
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    theirs = events(second_user.request(cgd, "GET", "/v1/events?follow=false"))
    everything = events(cgd.request("GET", "/v1/events?follow=false"))
    assert {e.get("component") for e in theirs} == {"theirs", None}
    assert ("drained", None) in [(e["type"], e.get("component")) for e in theirs], "the machine's events are everyone's"
    assert all(e["user"] == USER for e in theirs if e.get("component"))
    assert {"roots", "theirs"} <= {e.get("component") for e in everything}, "root sees all"
