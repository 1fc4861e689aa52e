"""`cgctl run`'s child handling, without a daemon: exit statuses, signals
passed on once, the child's environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from computegroups.cli.run import _signals_held, child_env, run_child

ROOT = Path(__file__).resolve().parents[2]

# Counts the signal it is told to count, then exits with the count.
COUNTER = textwrap.dedent("""
    import signal, sys, time
    count = 0
    def seen(signum, frame):
        global count
        count += 1
    signal.signal(getattr(signal, sys.argv[1]), seen)
    print("ready", flush=True)
    while not count:
        time.sleep(0.01)
    time.sleep(0.5)
    sys.exit(count)
""")

# Runs COUNTER under run_child, as `cgctl run` does; with "tty" it first takes
# its stdin (a pty) as controlling terminal, so ^C there comes from the kernel.
DRIVER = textwrap.dedent("""
    import fcntl, os, sys, termios
    if sys.argv[2] == "tty":
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    from computegroups.cli.run import _signals_held, run_child
    with _signals_held() as previous:
        code = run_child([sys.executable, "-c", sys.argv[3], sys.argv[1]], os.environ, None, previous)
    print(f"code={code}", flush=True)
""")


def _driver(signame: str, mode: str, **popen: Any) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", DRIVER, signame, mode, COUNTER], env=env, **popen)


def _kill_session(proc: subprocess.Popen[bytes]) -> None:
    """A failed test must not leave the driver and its counter behind."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def _run(argv: list[str]) -> int:
    with _signals_held() as previous:
        return run_child(argv, os.environ, None, previous)


def test_exit_status_passes_through() -> None:
    assert _run(["sh", "-c", "exit 3"]) == 3
    assert _run(["true"]) == 0


def test_death_by_signal_is_128_plus_the_signal() -> None:
    assert _run(["sh", "-c", "kill -TERM $$"]) == 128 + signal.SIGTERM


def test_command_not_found_is_127(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["/nonexistent/cmd"]) == 127
    assert capsys.readouterr().err.startswith("cgctl: error: cannot run '/nonexistent/cmd'")


def test_signal_mask_is_restored_afterwards() -> None:
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    _run(["true"])
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_signal_sent_to_cgctl_reaches_the_command_once(signame: str) -> None:
    proc = _driver(signame, "pipe", stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == b"ready\n"
        proc.send_signal(getattr(signal, signame))
        out, _ = proc.communicate(timeout=10)
    finally:
        _kill_session(proc)
    assert out.decode().strip() == "code=1"


def test_terminal_ctrl_c_is_not_sent_twice() -> None:
    master, slave = os.openpty()
    proc = _driver("SIGINT", "tty", stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    seen = b""
    try:
        while b"ready" not in seen:
            seen += os.read(master, 1024)
        os.write(master, b"\x03")
        while chunk := os.read(master, 1024):
            seen += chunk
    except OSError:  # EIO: every holder of the pty's other end has exited
        pass
    finally:
        _kill_session(proc)
        os.close(master)
    assert b"code=1" in seen, seen


def test_child_env_takes_devices_from_cgd_and_identity_from_the_shell() -> None:
    current = {"PATH": "/venv/bin:/usr/bin", "HOME": "/home/ada", "CUDA_VISIBLE_DEVICES": "0,1,2", "TERM": "xterm"}
    worker = {"PATH": "/usr/bin", "HOME": "/home/ada", "USER": "ada", "CUDA_VISIBLE_DEVICES": "3",
              "CG_COMPONENT": "run-1"}
    env = child_env(current, worker, {"EXTRA": "1"})
    assert env == {"PATH": "/venv/bin:/usr/bin", "HOME": "/home/ada", "CUDA_VISIBLE_DEVICES": "3",
                   "TERM": "xterm", "CG_COMPONENT": "run-1", "EXTRA": "1"}
