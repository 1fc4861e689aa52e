"""A failed fsync of the state journal: cgd says so where an operator looks, and changes nothing more.

After an fsync fails the kernel may have dropped the pages and cleared the
error, so cgd cannot know what the disk holds: it refuses every change until
it restarts (statefiles/store.py). Here the fsync fails on a real cgd (the
gate of tests/fsync_gate), and the test reads what an operator would:
`GET /v1/health`, `/metrics`, `cgctl status`, the Python client, systemd's
STATUS= line and the event stream of a follower connected before it.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from computegroups.daemon.client import CgdClient, CgdError, ComputeGroupManager, LocalComputeResourceProvider
from computegroups.statefiles import StateStore
from tests.daemon_fixture import Cgd, wait_for
from tests.fsync_gate import FsyncGate

pytestmark = pytest.mark.slow


def follow(cgd: Cgd) -> socket.socket:
    """A follower of `GET /v1/events` from now on."""
    since = cgd.request("GET", "/v1/version")[1]["events"]["last_seq"]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(cgd.socket))
    sock.sendall(f"GET /v1/events?follow=true&since={since} HTTP/1.1\r\nHost: cgd\r\nConnection: close\r\n\r\n"
                 .encode())
    sock.settimeout(20)
    return sock


def told_systemd(sock: socket.socket, start: str) -> str:
    """The first datagram cgd sent that starts with `start` (READY=1 and others come first)."""
    while not (message := sock.recv(4096).decode()).startswith(start):
        pass
    return message


def events_until(sock: socket.socket, type_: str) -> list[dict]:
    """The events a follower reads until one of `type_` (the stream is chunked: each event is one line)."""
    raw, events = b"", list[dict]()
    while not any(e["type"] == type_ for e in events):
        chunk = sock.recv(65536)
        assert chunk, f"the stream ended before a {type_} event: {raw[-500:]!r}"
        raw += chunk
        events = [json.loads(line) for line in raw.split(b"\r\n") if line.startswith(b"{")]
    return events


def test_after_a_failed_fsync_health_says_the_state_is_not_writable_and_every_change_is_refused(
        start_cgd: Callable[..., Cgd], tmp_path: Path, notify_socket: socket.socket) -> None:
    gate = FsyncGate(tmp_path / "gate")
    cgd = start_cgd("dgx-h100", env={**gate.env(), "NOTIFY_SOCKET": str(tmp_path / "notify")})
    assert cgd.request("POST", "/v1/components", {"name": "a", "claim": {"gpus": 1}})[0] == 201
    health = cgd.request("GET", "/v1/health")[1]
    assert (health["status"], health["state"]) == ("ok", {"writable": True, "error": None})
    follower = follow(cgd)
    try:
        wait_for(lambda: b"200 OK" in follower.recv(4096, socket.MSG_PEEK), "the follower connected")
        gate.fail()
        status, reply = cgd.request("POST", "/v1/components", {"name": "b", "claim": {"gpus": 1}})
        assert status == 503 and reply["error"]["code"] == "state_unwritable", reply
        why = reply["error"]["message"]
        assert "Input/output error" in why and "restart cgd" in why
        seen = events_until(follower, "state_unwritable")
    finally:
        follower.close()
    assert [e["type"] for e in seen] == ["state_unwritable"], "the refused change's event is never sent"
    assert seen[0]["reason"] == why and seen[0]["dropped"] == 1

    gate.heal()  # the disk works again: cgd still refuses, it cannot know what it holds
    status, again = cgd.request("POST", "/v1/components", {"name": "c", "claim": {"gpus": 1}})
    assert (status, again["error"]["message"]) == (503, why)
    status, health = cgd.request("GET", "/v1/health")
    assert status == 200 and health["status"] == "failing"
    assert health["state"] == {"writable": False, "error": why}
    assert CgdClient(cgd.socket).health()["state"]["error"] == why
    metrics = cgd.request("GET", "/metrics")[1].splitlines()
    assert next(line for line in metrics if line.startswith("computegroups_state_writable{")).endswith(" 0.0")
    shown = cgd.cgctl("status")
    assert shown.returncode == 1 and shown.stderr.splitlines() == [f"cgctl: error: {why}"], shown
    manager = ComputeGroupManager(LocalComputeResourceProvider(cgd.socket))
    with pytest.raises(CgdError) as refused:
        asyncio.run(manager.list_compute_nodes())
    assert (refused.value.code, refused.value.message) == ("state_unwritable", why)
    told = told_systemd(notify_socket, "STATUS=state not writable")
    assert why in told

    assert cgd.stop() == 0, cgd.log()
    on_disk = StateStore(cgd.state_dir).load()
    assert "a" in on_disk.components and "c" not in on_disk.components, "what was refused after it changed nothing"
