"""Roles and faults (issue 13): every replica with live workers has exactly one
primary, whatever order the primary, its shadow and cgd die or are released in.

A real cgd on the simulated dgx-h100; the roles are read where a worker reads
them: the role file its environment names, for each live process in /proc.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.daemon_fixture import Cgd, wait_for

pytestmark = pytest.mark.slow

WORKER = [sys.executable, "-c", (
    "import os, signal, time\n"
    "def promoted(*_):\n"
    "    print('promoted to', open(os.environ['CG_ROLE_FILE']).read().strip(), flush=True)\n"
    "signal.signal(signal.SIGUSR1, promoted)\n"
    "print('started', os.environ['CG_ROLE'], flush=True)\n"
    "while True: time.sleep(0.05)\n")]
RESTART = {"max_retries": 50, "backoff_s": 0.1}
PRIMARY, SHADOW = "web", "web-standby"


def environ(pid: int) -> dict[str, str] | None:
    try:
        if "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text():
            return None
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return dict(item.decode().split("=", 1) for item in raw.split(b"\0") if b"=" in item)


def live_roles(cgd: Cgd, refs: dict[int, str] | None = None) -> dict[int, dict[int, str]]:
    """Per replica index, each live worker's pid and the role its role file says
    (and, into `refs`, each pid's component/replica)."""
    out: dict[int, dict[int, str]] = {}
    for pid in cgd.worker_pids():
        env = environ(pid)
        if env is None or "CG_ROLE_FILE" not in env or env.get("CG_COMPONENT") not in (PRIMARY, SHADOW):
            continue  # a launch shim not yet exec'd, or gone meanwhile
        try:
            role = Path(env["CG_ROLE_FILE"]).read_text().strip()
        except OSError:
            role = "missing"
        out.setdefault(int(env["CG_REPLICA"]), {})[pid] = role
        if refs is not None:
            refs[pid] = f"{env['CG_COMPONENT']}/{env['CG_REPLICA']}"
    return out


def one_primary(cgd: Cgd, expect_workers: int = 2, killed: tuple[int, ...] = ()) -> dict[int, dict[int, str]]:
    """Wait until each replica with live workers has exactly one primary (and,
    while they settle, never two): the role files, and the state's roles agree.
    `killed`: pids just sent SIGKILL, gone before anything counts."""
    wait_for(lambda: not any(environ(pid) for pid in killed), f"{killed} have ended")
    seen_two: list[dict[int, dict[int, str]]] = []

    def settled() -> dict[int, dict[int, str]] | None:
        refs: dict[int, str] = {}
        roles = live_roles(cgd, refs)
        if any(list(r.values()).count("primary") > 1 for r in roles.values()):
            # A moment of two: confirm it is not a process that ended as we looked.
            again = live_roles(cgd)
            if any(list(r.values()).count("primary") > 1 for r in again.values()):
                seen_two.append(again)
        if not roles or any(len(r) != expect_workers or list(r.values()).count("primary") != 1
                            for r in roles.values()):
            return None
        workers = cgd.state()["workers"]
        for by_pid in roles.values():
            for pid, role in by_pid.items():
                if workers.get(refs[pid], {}).get("role") != role:
                    return None
        return roles

    try:
        roles = wait_for(settled, "each replica with live workers has exactly one primary", timeout=15)
    except AssertionError:
        raise AssertionError(f"roles: {live_roles(cgd)}\nstate: {cgd.state()['workers']}\n{cgd.log()}") from None
    assert roles is not None and not seen_two, f"two primaries at once: {seen_two}"
    return roles


def pid_of(cgd: Cgd, component: str, role: str | None = None) -> int:
    roles = live_roles(cgd)[0]
    pids = [p for p in roles if environ(p) and environ(p)["CG_COMPONENT"] == component]  # type: ignore[index]
    assert len(pids) == 1, (component, roles)
    if role is not None:
        assert roles[pids[0]] == role, (component, roles)
    return pids[0]


def catches_usr1(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) >> (signal.SIGUSR1 - 1) & 1)


def promotable(cgd: Cgd) -> None:
    """Both workers handle the promotion signal and have run long enough for cgd to promote
    (computegroups.daemon.core.events.PROMOTION_MIN_UPTIME_S)."""
    def ready() -> bool:
        refs: dict[int, str] = {}
        live_roles(cgd, refs)
        workers = cgd.state()["workers"]
        return len(refs) == len(workers) and all(
            catches_usr1(pid) and workers[ref]["create_time"] and time.time() - workers[ref]["create_time"] >= 1.1
            for pid, ref in refs.items())
    wait_for(ready, "both workers can be promoted", timeout=15)


def web_with_shadow(cgd: Cgd) -> None:
    for body in ({"name": PRIMARY, "claim": {"gpus": 1}}, {"name": SHADOW, "shadow_of": PRIMARY}):
        status, reply = cgd.request("POST", "/v1/components", {**body, "command": WORKER, "restart": RESTART})
        assert status == 201, reply
    one_primary(cgd)
    promotable(cgd)


@pytest.mark.parametrize("settled", [True, False], ids=["settled", "at-once"])
def test_the_shadow_takes_over_and_its_release_hands_the_role_back(cgd: Cgd, settled: bool) -> None:
    """`at-once`: the old primary, back as a shadow a moment ago, may not handle the
    promotion signal yet: it is restarted as primary instead of being told."""
    web_with_shadow(cgd)
    primary = pid_of(cgd, PRIMARY, "primary")
    os.kill(primary, signal.SIGKILL)
    one_primary(cgd, killed=(primary,))
    survivor = pid_of(cgd, SHADOW, "primary")

    if settled:
        promotable(cgd)
    status, reply = cgd.request("DELETE", f"/v1/components/{SHADOW}")
    if status == 200:
        roles = one_primary(cgd, expect_workers=1)
        assert list(roles[0].values()) == ["primary"] and survivor not in roles[0]
        assert cgd.state()["workers"][f"{PRIMARY}/0"]["role"] == "primary"
        if settled:
            log = cgd.log_dir / PRIMARY / "0.out"
            wait_for(lambda: "promoted to primary" in log.read_text(), "the worker was told by the promotion signal")
    else:
        assert status == 409 and reply["error"]["message"], reply
        assert one_primary(cgd)[0][survivor] == "primary"


@pytest.mark.parametrize("first", [SHADOW, PRIMARY])
def test_shadow_and_primary_killed_back_to_back(cgd: Cgd, first: str) -> None:
    web_with_shadow(cgd)
    pids = {name: pid_of(cgd, name) for name in (PRIMARY, SHADOW)}
    second = SHADOW if first == PRIMARY else PRIMARY
    os.kill(pids[first], signal.SIGKILL)
    os.kill(pids[second], signal.SIGKILL)
    one_primary(cgd, killed=tuple(pids.values()))


def test_cgd_killed_during_a_promotion(cgd: Cgd) -> None:
    web_with_shadow(cgd)
    shadow = pid_of(cgd, SHADOW, "shadow")
    primary = pid_of(cgd, PRIMARY, "primary")
    os.kill(primary, signal.SIGKILL)
    cgd.kill9()
    cgd.start()
    roles = one_primary(cgd, killed=(primary,))
    assert roles[0][shadow] == "primary", "the live shadow is promoted, not restarted"


def test_a_released_promoted_shadow_hands_the_role_back_before_it_is_stopped(cgd: Cgd) -> None:
    """Make before break: while the released worker takes its grace period to stop, the
    primary component's worker already reads `primary`; the replica is never without one."""
    slow_stop = [WORKER[0], "-c", WORKER[2].replace(
        "while True:", "def stop(*_):\n    print('stopping', flush=True)\n    time.sleep(2)\n    raise SystemExit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\nwhile True:")]
    for body in ({"name": PRIMARY, "claim": {"gpus": 1}, "command": WORKER},
                 {"name": SHADOW, "shadow_of": PRIMARY, "command": slow_stop}):
        status, reply = cgd.request("POST", "/v1/components", {**body, "restart": RESTART})
        assert status == 201, reply
    one_primary(cgd)
    promotable(cgd)
    primary = pid_of(cgd, PRIMARY, "primary")
    os.kill(primary, signal.SIGKILL)
    one_primary(cgd, killed=(primary,))  # not the roles of before the kill
    promotable(cgd)
    back = pid_of(cgd, PRIMARY, "shadow")
    role_file = Path(environ(back)["CG_ROLE_FILE"])  # type: ignore[index]
    released: list[tuple[int, object]] = []
    deleting = threading.Thread(target=lambda: released.append(cgd.request("DELETE", f"/v1/components/{SHADOW}")))
    deleting.start()
    try:
        shadow_log = cgd.log_dir / SHADOW / "0.out"
        wait_for(lambda: "stopping" in shadow_log.read_text(), "the released worker was asked to stop")
        assert role_file.read_text().strip() == "primary", "the role was handed back before the stop"
    finally:
        deleting.join(30)
    assert released and released[0][0] == 200, released
    assert one_primary(cgd, expect_workers=1)[0] == {back: "primary"}
