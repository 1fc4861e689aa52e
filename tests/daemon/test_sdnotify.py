"""sd_notify over a real datagram socket, as systemd would listen."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from computegroups.daemon.sdnotify import notify, watchdog_interval


def test_ready_and_friends_reach_the_socket(notify_socket: socket.socket, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    for state in ("READY=1", "STATUS=serving 8 GPUs", "WATCHDOG=1", "STOPPING=1"):
        assert notify(state)
        assert notify_socket.recv(4096) == state.encode()


def test_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"cg-test-notify-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify("READY=1\nSTATUS=up")
        assert sock.recv(4096) == b"READY=1\nSTATUS=up"


def test_outside_systemd_nothing_happens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not notify("READY=1")
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert not notify("READY=1")
    monkeypatch.setenv("NOTIFY_SOCKET", "relative/path")
    assert not notify("READY=1")


def test_watchdog_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert watchdog_interval() == 30.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert watchdog_interval() == 30.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))
    assert watchdog_interval() is None
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    for bad in ("0", "-5", "soon"):
        monkeypatch.setenv("WATCHDOG_USEC", bad)
        assert watchdog_interval() is None
