"""cgd under a flood of connections, and a second cgd pointed at a live socket.

A local client that opens connections and never closes them must not take
the daemon down: connections over the caps are refused with a JSON 503, the
accept loop never spins, and cgd answers again as soon as they are closed.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import selectors
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import cast

import psutil
import pytest
import tornado.web

from computegroups.daemon.api.listener import MAX_CONNECTIONS, MAX_CONNECTIONS_PER_UID, CgdHTTPServer
from tests.daemon_fixture import Cgd

pytestmark = pytest.mark.slow


class LowFdCgd(Cgd):
    """A cgd whose soft and hard descriptor limits are both 256, so it cannot raise them."""

    def command(self) -> list[str]:
        return ["/bin/sh", "-c", 'ulimit -n 256 && exec "$@"', "cgd", *super().command()]


@pytest.fixture
def low_fd_cgd(tmp_path: Path) -> Iterator[Cgd]:
    cgd = LowFdCgd(tmp_path, "dgx-h100")
    try:
        yield cgd.start()
    finally:
        cgd.cleanup()


def open_idle(path: Path, count: int) -> list[socket.socket]:
    """Connections that send nothing, the way a careless or hostile client holds them."""
    conns = []
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(path))
        sock.setblocking(False)
        conns.append(sock)
    return conns


def close_all(conns: list[socket.socket]) -> None:
    for sock in conns:
        sock.close()


def refusals(conns: list[socket.socket], within: float) -> list[dict]:
    """The JSON errors of the connections cgd answered and closed within the time."""
    answers = {sock: b"" for sock in conns}
    closed: list[socket.socket] = []
    deadline = time.monotonic() + within
    with selectors.DefaultSelector() as sel:
        for sock in conns:
            sel.register(sock, selectors.EVENT_READ, data=sock)
        while sel.get_map() and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
                sock = key.data
                chunk = sock.recv(65536)
                answers[sock] += chunk
                if not chunk:
                    sel.unregister(sock)
                    closed.append(sock)
    return [parse_refusal(answers[sock]) for sock in closed]


def flood(path: Path, count: int, cap: int) -> tuple[list[socket.socket], list[dict]]:
    """Open `count` idle connections, then top them up to exactly `cap` held open.

    The fixture's own first request may not be let go yet when the flood
    arrives; once cgd has refused what it will, the slot it frees is filled.
    """
    conns = open_idle(path, count)
    try:
        errors = refusals(conns, within=3.0)
        held = count - len(errors)
        assert cap - 1 <= held <= cap
        return conns + open_idle(path, cap - held), errors
    except BaseException:
        close_all(conns)
        raise


def parse_refusal(raw: bytes) -> dict:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 "), raw[:200]
    return json.loads(body)["error"]


def refused_at_once(cgd: Cgd) -> dict:
    """A fresh connection over the cap is answered with a 503 and closed, not left hanging."""
    (sock,) = open_idle(cgd.socket, 1)
    try:
        (error,) = refusals([sock], within=3.0)
    finally:
        sock.close()
    return error


def cpu_seconds(pid: int, over: float) -> float:
    proc = psutil.Process(pid)
    before = proc.cpu_times()
    time.sleep(over)
    after = proc.cpu_times()
    return (after.user + after.system) - (before.user + before.system)


def answers_again(cgd: Cgd, within: float = 3.0) -> bool:
    """True once GET /v1/version succeeds; the closed connections are let go as cgd sees them."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if cgd.request("GET", "/v1/version", timeout=1.0)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def assert_quiet(cgd: Cgd) -> None:
    text = cgd.stderr_path.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    assert len(text) < 20_000, text[-3000:]


def test_root_is_held_to_the_global_cap_only(cgd: Cgd) -> None:
    """Root administers cgd: no per-uid cap (a second user's is tested in test_multiuser), but the global one."""
    over_per_uid = MAX_CONNECTIONS_PER_UID + 20
    conns = open_idle(cgd.socket, over_per_uid)
    try:
        assert refusals(conns, within=1.0) == []
        assert cgd.request("GET", "/v1/version")[0] == 200
        conns += open_idle(cgd.socket, MAX_CONNECTIONS - over_per_uid)
        error = refused_at_once(cgd)
        assert error["code"] == "unavailable" and "too many connections to cgd" in error["message"], error
        assert cpu_seconds(cgd.pid, over=1.0) < 0.5
    finally:
        close_all(conns)
    assert answers_again(cgd)
    assert_quiet(cgd)


def test_a_flood_under_a_low_descriptor_limit_neither_spins_nor_floods_the_log(low_fd_cgd: Cgd) -> None:
    # 400 connections against a cap of a quarter of the 256 descriptors.
    conns, _ = flood(low_fd_cgd.socket, 400, 256 // 4)
    try:
        assert cpu_seconds(low_fd_cgd.pid, over=1.0) < 0.5
        assert_quiet(low_fd_cgd)
        assert refused_at_once(low_fd_cgd)["code"] == "unavailable"
    finally:
        close_all(conns)
    assert answers_again(low_fd_cgd)
    # Descriptors are left for the workers: one can still be started.
    status, _ = low_fd_cgd.request("POST", "/v1/components", {
        "name": "after-flood", "claim": {"gpus": 1}, "command": ["sleep", "30"]})
    assert status == 201, status


def test_second_cgd_on_a_live_socket_is_refused(cgd: Cgd, tmp_path: Path) -> None:
    inode = cgd.socket.stat().st_ino
    second = Cgd(tmp_path, "dgx-h100")
    command = [*second.command()[:-6], "--socket", str(cgd.socket),
               "--state-dir", str(second.state_dir), "--log-dir", str(second.log_dir)]
    proc = subprocess.Popen(command, env=second.env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0
    assert f"cgd: error: socket {cgd.socket} is in use by another cgd (pid {cgd.pid})" in stderr
    assert cgd.socket.stat().st_ino == inode
    status, version = cgd.request("GET", "/v1/version")
    assert status == 200 and version["pid"] == cgd.pid


def test_a_stale_socket_is_replaced(start_cgd: Callable[..., Cgd], tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(tmp_path / "run" / "cgd.sock"))
    cgd = start_cgd("dgx-h100", root=tmp_path)
    assert cgd.request("GET", "/v1/version")[0] == 200


class FailingListener:
    """A listening socket whose first accepts fail the way they do once descriptors run out."""

    def __init__(self, sock: socket.socket, failures: int) -> None:
        self.sock = sock
        self.failures = failures
        self.calls = 0

    def fileno(self) -> int:
        return self.sock.fileno()

    def accept(self) -> tuple[socket.socket, str]:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return self.sock.accept()

    def close(self) -> None:
        self.sock.close()


class Hello(tornado.web.RequestHandler):
    def get(self) -> None:
        self.write("hello")


async def get_through(listener: FailingListener, path: Path) -> bytes:
    server = CgdHTTPServer(tornado.web.Application([(r"/", Hello)]))
    # The listener stands in for the listening socket: serve() only calls accept, fileno and close.
    server.serve(cast(socket.socket, listener))
    try:
        reader, writer = await asyncio.open_unix_connection(str(path))
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), timeout=5)
        writer.close()
        await writer.wait_closed()
        return answer
    finally:
        server.stop()


def test_running_out_of_descriptors_pauses_accepting_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "s.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(8)
    sock.setblocking(False)
    listener = FailingListener(sock, failures=3)
    with caplog.at_level(logging.INFO, logger="cgd.server"):
        answer = asyncio.run(get_through(listener, path))
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"hello")
    # Backing off, not retrying on every turn of the loop.
    assert listener.calls <= 6
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Too many open files" in warnings[0].getMessage()


def exchange(cgd: Cgd, raw: bytes) -> bytes:
    """Send raw bytes as one request; everything cgd answers before it closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(cgd.socket))
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


@pytest.mark.parametrize(("raw", "status", "code"), [
    (b"POST /v1/components HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
     400, "bad_request"),
    (b"POST /v1/components HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999\r\n\r\n", 400, "bad_request"),
    (b"GET /v1/version HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n", 431, "headers_too_large"),
])
def test_what_tornado_refuses_itself_answers_the_json_error_shape(cgd: Cgd, raw: bytes, status: int,
                                                                   code: str) -> None:
    head, _, body = exchange(cgd, raw).partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), head
    assert json.loads(body)["error"]["code"] == code
    assert cgd.request("GET", "/v1/version")[0] == 200
