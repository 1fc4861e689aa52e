"""cgctl's waits and follows across a clean restart of cgd (SIGTERM, as `systemctl restart` sends):
they reconnect and go on, as they do across a kill -9, and a waiting claim is kept."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.daemon_fixture import Cgd, wait_for

pytestmark = pytest.mark.slow

CGCTL = str(Path(sys.executable).parent / "cgctl")


def ok(cgd: Cgd, *args: str) -> str:
    done = cgd.cgctl(*args)
    assert done.returncode == 0, (args, done.stdout, done.stderr, cgd.log())
    return done.stdout


def in_long_poll(proc: subprocess.Popen[str]) -> Callable[[], bool]:
    """A check that `proc` holds a connection across two looks (`wait_for`'s interval apart): a long
    poll, not the short exchange before it, so a restart then cuts the poll and nothing else."""
    seen: set[str] = set()

    def check() -> bool:
        nonlocal seen
        fds = Path(f"/proc/{proc.pid}/fd")
        now = {link for link in (_readlink(fd) for fd in fds.iterdir()) if link.startswith("socket:")}
        held, seen = now & seen, now
        assert proc.poll() is None, proc.communicate()
        return bool(held)
    return check


def _readlink(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:  # closed since the listing
        return ""


def restart(cgd: Cgd) -> None:
    """SIGTERM, then a new cgd on the same state; the workers stay (`--keep-workers`)."""
    assert cgd.stop() == 0, cgd.log()
    cgd.start()


def test_allocate_wait_goes_on_across_a_clean_restart_and_is_placed(start_cgd, tmp_path: Path) -> None:
    cgd = start_cgd("dgx-h100", "--keep-workers")
    go = tmp_path / "go"
    ok(cgd, "allocate", "hog", "--gpus", "8", "--", "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done")
    waiting = subprocess.Popen([CGCTL, "allocate", "waiter", "--gpus", "2", "--wait", "--", "sh", "-c", "echo ran"],
                               env=cgd.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: "pending #1" in ok(cgd, "list"), "the claim queued")
    wait_for(in_long_poll(waiting), "cgctl waiting for the claim's turn", interval=0.5)
    restart(cgd)
    wait_for(lambda: "pending #1" in ok(cgd, "list") and waiting.poll() is None, "the new cgd serving")
    go.touch()
    out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 0 and out.startswith("started waiter"), (out, err, cgd.log())
    ok(cgd, "wait", "waiter")
    assert (cgd.log_dir / "waiter" / "0.out").read_text() == "ran\n"
    assert "internal error" not in cgd.log() and "dropped queued claims" not in cgd.log(), cgd.log()


def test_wait_goes_on_across_a_clean_restart_and_says_the_exit_code(start_cgd, tmp_path: Path) -> None:
    cgd = start_cgd("dgx-h100", "--keep-workers")
    go = tmp_path / "go"
    ok(cgd, "allocate", "job", "--gpus", "1", "--restart", "never", "--",
       "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done; exit 3")
    waiting = subprocess.Popen([CGCTL, "wait", "job"], env=cgd.env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    wait_for(in_long_poll(waiting), "cgctl waiting for the job's end", interval=0.5)
    restart(cgd)
    listed = ok(cgd, "list")
    assert waiting.poll() is None, (listed, waiting.communicate(), cgd.log())
    go.touch()
    out, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 3 and out.startswith("job failed"), (out, err, cgd.log())
    assert "internal error" not in cgd.log(), cgd.log()


def test_logs_follow_goes_on_across_a_clean_restart(start_cgd, tmp_path: Path) -> None:
    """The follower finds cgd gone (says so once), waits for the next one and shows what the
    worker wrote meanwhile and after."""
    cgd = start_cgd("dgx-h100", "--keep-workers")
    go = tmp_path / "go"
    script = f"echo before; while [ ! -e {go} ]; do sleep 0.02; done; echo after; sleep 600"
    ok(cgd, "allocate", "talker", "--gpus", "1", "--", "sh", "-c", script)
    shown, said = tmp_path / "shown", tmp_path / "said"
    with open(shown, "w") as out, open(said, "w") as err:
        following = subprocess.Popen([CGCTL, "logs", "talker", "-f"], env=cgd.env(), stdout=out, stderr=err)
    note = "cgctl: cgd went away; reconnecting to follow talker/0's stdout from byte 7\n"
    try:
        wait_for(lambda: shown.read_text() == "before\n", "the first line shown")
        assert cgd.stop() == 0, cgd.log()
        wait_for(lambda: said.read_text() or following.poll() is not None, "the follower finding cgd gone")
        assert following.poll() is None and said.read_text() == note, said.read_text()
        cgd.start()
        go.touch()
        wait_for(lambda: shown.read_text() == "before\nafter\n" or following.poll() is not None,
                 "the line written after the restart shown")
        assert following.poll() is None and said.read_text() == note, said.read_text()
    finally:
        following.terminate()
        following.wait(timeout=10)


def test_a_request_still_running_when_cgd_stops_is_answered_stopping(start_cgd, tmp_path: Path) -> None:
    """A release waiting out a long grace is not a wait cgd can end: once cgd's stop has waited for
    it as long as it does (30 s), it is answered `stopping` (ask again), never an internal error."""
    cgd = start_cgd("dgx-h100", "--keep-workers")
    ok(cgd, "allocate", "stubborn", "--gpus", "1", "--", "sh", "-c",
       "trap '' TERM; echo ready; while :; do sleep 0.05; done")
    wait_for(lambda: (cgd.log_dir / "stubborn" / "0.out").read_text() == "ready\n", "the worker up")
    releasing = subprocess.Popen([CGCTL, "release", "stubborn", "--stop-timeout", "80s"], env=cgd.env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(in_long_poll(releasing), "the release waiting for the worker", interval=0.5)
    assert cgd.stop(timeout=90) == 0, cgd.log()
    out, err = releasing.communicate(timeout=30)
    assert releasing.returncode == 1 and "cgd is stopping; ask again once it is back" in err, (out, err)
    assert "internal error" not in cgd.log(), cgd.log()
