"""An answer to a change is sent only once the change is on disk.

cgd commits in groups: a change is appended to the journal and the lock let
go before its fsync, which the next requests share. The reply to the one
who asked must still wait for that fsync: a client told 201 acts on it, and
a crash right after must not take back what it was told. These tests hold
the fsync of the journal at a gate (tests/fsync_gate) and look at the
socket: no answer while it is held, the answer and the change on disk once
it is let go.
"""

from __future__ import annotations

import json
import select
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from computegroups.statefiles import StateStore
from computegroups.statefiles.schema import StateDoc
from tests.daemon_fixture import Cgd
from tests.fsync_gate import FsyncGate

pytestmark = pytest.mark.slow

QUIET_S = 1.0
"""How long to watch the socket for an answer that must not come: bounded, since nothing arriving is the point."""


def send(cgd: Cgd, method: str, path: str, body: object) -> socket.socket:
    """A request sent and not yet answered, on its own connection."""
    data = json.dumps(body).encode()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(cgd.socket))
    sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: cgd\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
    return sock


def answered(sock: socket.socket, within: float) -> bool:
    return bool(select.select([sock], [], [], within)[0])


def answer(sock: socket.socket, timeout: float = 20.0) -> tuple[int, dict]:
    sock.settimeout(timeout)
    raw = b""
    while chunk := sock.recv(65536):
        raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def component_a(state: StateDoc, reply: dict) -> bool:
    return reply["name"] == "a" and "a" in state.components


def the_group(state: StateDoc, reply: dict) -> bool:
    return reply["id"] in state.groups


@pytest.mark.parametrize(("path", "body", "on_disk"), [
    ("/v1/components", {"name": "a", "claim": {"gpus": 1}}, component_a),
    ("/v1/groups", {"claim": {"gpus": 1}}, the_group),
], ids=["allocate", "create-group"])
def test_the_answer_to_a_change_waits_for_the_fsync_of_its_journal_entry(
        start_cgd: Callable[..., Cgd], tmp_path: Path, path: str, body: dict,
        on_disk: Callable[[StateDoc, dict], bool]) -> None:
    gate = FsyncGate(tmp_path / "gate")
    cgd = start_cgd("dgx-h100", env=gate.env())
    store = StateStore(cgd.state_dir)
    before = store.load().generation
    gate.hold()
    sock = send(cgd, "POST", path, body)
    try:
        gate.wait_held()
        synced = gate.synced()
        assert store.load().generation == before + 1, "the change is written, its fsync held"
        assert not answered(sock, QUIET_S), "answered before the fsync of its change returned"
        gate.release()
        code, reply = answer(sock)
    finally:
        gate.release()
        sock.close()
    assert code == 201, reply
    assert gate.synced() > synced, "the fsync that was held has returned"
    assert on_disk(store.load(), reply)
