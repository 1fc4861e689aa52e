"""Both clients against a fake socket: what travels, and each way it fails."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from computegroups.daemon.client.aio import AsyncCgdClient
from computegroups.daemon.client.errors import CgdError, CgdNotRunning, CgdUnreachable
from computegroups.daemon.client.sync import CgdClient
from tests.client.fake_socket import FakeSocket, http_answer


def _sync(path: Path, timeout: float = 5.0) -> Callable[[str, tuple[Any, ...]], Any]:
    client = CgdClient(path, timeout=timeout)
    return lambda method, args: getattr(client, method)(*args)


def _async(path: Path, timeout: float = 5.0) -> Callable[[str, tuple[Any, ...]], Any]:
    client = AsyncCgdClient(path, timeout=timeout)
    return lambda method, args: asyncio.run(getattr(client, method)(*args))


both = pytest.mark.parametrize("make", [_sync, _async], ids=["sync", "async"])


@pytest.fixture
def sock_path(tmp_path: Path) -> Path:
    return tmp_path / "cgd.sock"


@both
def test_request_line_body_and_answer(make, sock_path: Path) -> None:
    with FakeSocket(sock_path, http_answer(201, b'{"name": "web"}')) as server:
        answer = make(sock_path)("create_component", ({"name": "web", "claim": {"gpus": 1}},))
    assert answer == {"name": "web"}
    head, _, body = server.requests[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/components HTTP/1.1")
    assert json.loads(body) == {"name": "web", "claim": {"gpus": 1}}


@both
def test_names_are_one_path_segment_and_queries_are_encoded(make, sock_path: Path) -> None:
    with FakeSocket(sock_path, http_answer(200, b"{}")) as server:
        make(sock_path)("get_component", ("a/../b",))
        make(sock_path)("component_logs", ("web", 1, "stderr", None, 40))
        make(sock_path)("release_all", ())
        make(sock_path)("release_components", (["a/b", "c"], 2.5))
    lines = [r.split(b"\r\n", 1)[0] for r in server.requests]
    assert lines == [
        b"GET /v1/components/a%2F..%2Fb HTTP/1.1",
        b"GET /v1/components/web/logs?replica=1&stream=stderr&offset=40 HTTP/1.1",
        b"DELETE /v1/components?all=true HTTP/1.1",
        b"DELETE /v1/components?name=a%2Fb&name=c&stop_timeout=2.5 HTTP/1.1",
    ]


@both
def test_refusal_becomes_cgd_error(make, sock_path: Path) -> None:
    body = json.dumps({"error": {"code": "forbidden", "message": "component 'web' belongs to uid 1000"}})
    with FakeSocket(sock_path, http_answer(403, body.encode(), "Forbidden")), pytest.raises(CgdError) as caught:
        make(sock_path)("release_component", ("web",))
    assert caught.value.code == "forbidden" and caught.value.status == 403


@both
def test_chunked_answer(make, sock_path: Path) -> None:
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n[]\r\n0\r\n\r\n"
    with FakeSocket(sock_path, answer):
        assert make(sock_path)("status", ()) == []


@both
def test_no_socket_means_not_running_with_the_fix(make, sock_path: Path) -> None:
    with pytest.raises(CgdNotRunning) as caught:
        make(sock_path)("version", ())
    assert str(caught.value) == (
        f"cgd is not running (no socket at {sock_path}): start it with `cgd` or `systemctl start computegroups`")
    assert not caught.value.stale


@both
def test_socket_left_by_a_dead_daemon_is_not_running(make, sock_path: Path) -> None:
    leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    leftover.bind(str(sock_path))
    leftover.close()
    with pytest.raises(CgdNotRunning, match="nothing listens on the socket") as caught:
        make(sock_path)("version", ())
    assert caught.value.stale


@both
def test_silent_daemon_times_out(make, sock_path: Path) -> None:
    with FakeSocket(sock_path, b"", silent=True), pytest.raises(CgdUnreachable, match=r"no answer within 0.3s"):
        make(sock_path, timeout=0.3)("version", ())


@both
def test_garbage_answer_is_unreachable_not_a_crash(make, sock_path: Path) -> None:
    with FakeSocket(sock_path, b"garbage\r\n\r\n"), pytest.raises(CgdUnreachable, match="broken answer"):
        make(sock_path)("version", ())


def test_socket_follows_cg_socket(monkeypatch: pytest.MonkeyPatch, sock_path: Path) -> None:
    monkeypatch.setenv("CG_SOCKET", str(sock_path))
    assert CgdClient().socket_path == sock_path
    assert CgdClient("/elsewhere.sock").socket_path == Path("/elsewhere.sock")


def test_releasing_no_names_is_a_value_error_before_anything_is_sent() -> None:
    from computegroups.daemon.client.sync import CgdClient

    with pytest.raises(ValueError, match="at least one"):
        CgdClient("/nonexistent.sock").release_components([])

