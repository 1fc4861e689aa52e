"""The listener on cgd's Unix socket: who may connect, how many, and what a refusal looks like.

Connections are capped in all and per uid (root excepted) with a JSON 503, accept backs off
when file descriptors run out, and a live cgd's socket is never taken over.
"""

from __future__ import annotations

import grp
import json
import logging
import os
import resource
import socket
import struct
import sys
import time
from asyncio import Future
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import tornado.http1connection
import tornado.httpserver
import tornado.ioloop
import tornado.iostream
import tornado.netutil
import tornado.web

from computegroups.daemon.api.body import MAX_BODY
from computegroups.daemon.core.transactions import Caller

if TYPE_CHECKING:
    from computegroups.daemon.api.server import CgdApp

log = logging.getLogger("cgd.server")


def peer_credentials(sock: socket.socket) -> Caller:
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", data)
    return Caller(pid=pid, uid=uid, gid=gid)


MAX_CONNECTIONS = 256


MAX_CONNECTIONS_PER_UID = 64


ACCEPT_BATCH = 128


ACCEPT_BACKOFF_MIN = 0.1


ACCEPT_BACKOFF_MAX = 1.0


PROBE_TIMEOUT = 2.0


REFUSAL_LOG_INTERVAL = 60.0


class SocketInUse(Exception):
    """Another process serves on cgd's socket path: binding there would steal it."""


def refuse_live_socket(path: Path) -> None:
    """Raise SocketInUse when something answers on `path`; a stale socket is left to be replaced.

    tornado's bind_unix_socket unlinks whatever socket is at the path, so a
    second cgd with another state directory would silently take over a running
    one's socket, leaving it unreachable while both hand out the same GPUs.
    """
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(PROBE_TIMEOUT)
    try:
        probe.connect(str(path))
        pid = peer_credentials(probe).pid
    except (FileNotFoundError, ConnectionRefusedError):
        return
    except (BlockingIOError, TimeoutError):
        raise SocketInUse(f"socket {path} is in use by a process that does not accept connections") from None
    except OSError as exc:
        raise SocketInUse(f"socket {path} exists and cannot be checked: {exc.strerror or exc}") from None
    finally:
        probe.close()
    raise SocketInUse(f"socket {path} is in use by another cgd (pid {pid})")


def connection_cap(limit: int = MAX_CONNECTIONS) -> int:
    """The global cap, kept to a quarter of the descriptor limit: workers and state files need the rest."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return limit
    return max(16, min(limit, soft // 4))


def refusal(message: str, status: int = 503, reason: str = "Service Unavailable", code: str = "unavailable") -> bytes:
    """A complete HTTP answer with cgd's JSON error, for a request the handlers never see."""
    body = json.dumps({"error": {"code": code, "message": message}}) + "\n"
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return (head + body).encode()


BARE_400 = b"HTTP/1.1 400 Bad Request\r\n\r\n"
NOT_HTTP = refusal(
    "the request is not valid HTTP/1.1: its framing (Content-Length, chunked encoding) is broken, "
    f"or its body is over {256 * MAX_BODY // (1024 * 1024)} MiB", 400, "Bad Request", "bad_request")
HEADERS_TOO_LARGE = refusal(
    "the request's headers are over 64 KiB", 431, "Request Header Fields Too Large", "headers_too_large")


class JsonErrorStream(tornado.iostream.IOStream):
    """What tornado refuses before any handler runs answers in cgd's JSON error shape too.

    tornado answers a request it cannot frame with a bare 400 and headers past
    its limit with a closed connection; a client of cgd would then see no
    `{"error": ...}` at all.
    """

    def write(self, data: bytes | memoryview) -> Future[None]:
        if bytes(data) == BARE_400:
            data = NOT_HTTP
        return super().write(data)

    def close(self, exc_info: Any = False) -> None:
        error = sys.exc_info()[1] if exc_info is True else exc_info[1] if isinstance(exc_info, tuple) else exc_info
        if isinstance(error, tornado.iostream.UnsatisfiableReadError) and self.socket is not None:
            try:
                self.socket.send(HEADERS_TOO_LARGE)
            except OSError:
                pass
        super().close(exc_info)


class CgdHTTPServer(tornado.httpserver.HTTPServer):
    """tornado's HTTPServer with its own accept loop: connection caps and a pause when out of descriptors.

    tornado's accept handler lets EMFILE escape; the listening socket stays
    readable, so it fails again on every turn of the loop: 100% CPU and a
    traceback each time. Here a failed accept stops accepting for a backoff,
    and connections over the global or per-uid cap are answered with a 503
    and closed at once, so one client cannot use up the daemon's descriptors.
    """

    def initialize(self, *args: Any, max_connections: int = MAX_CONNECTIONS,
                   max_per_uid: int = MAX_CONNECTIONS_PER_UID, **kwargs: Any) -> None:
        super().initialize(*args, **kwargs)
        self.max_connections = max_connections
        self.max_per_uid = min(max_per_uid, max_connections)
        self.per_uid: Counter[int] = Counter()
        self.owners: dict[tornado.iostream.IOStream, int] = {}
        self.listener: socket.socket | None = None
        self.resume: object | None = None
        self.backoff = ACCEPT_BACKOFF_MIN
        self.starved = False
        self.refused = 0
        self.refusal_logged = float("-inf")

    def serve(self, sock: socket.socket) -> None:
        """Accept connections on a listening, non-blocking socket."""
        self.listener = sock
        tornado.ioloop.IOLoop.current().add_handler(sock, self._accept_ready, tornado.ioloop.IOLoop.READ)

    def stop(self) -> None:
        """Stop accepting and close the socket; open connections finish their requests."""
        io_loop = tornado.ioloop.IOLoop.current()
        if self.resume is not None:
            io_loop.remove_timeout(self.resume)
            self.resume = None
        if self.listener is not None:
            io_loop.remove_handler(self.listener)
            self.listener.close()
            self.listener = None
        super().stop()

    def _accept_ready(self, fd: Any, events: int) -> None:
        for _ in range(ACCEPT_BATCH):
            listener = self.listener
            if listener is None:
                return
            try:
                conn, address = listener.accept()
            except BlockingIOError:
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                self._pause(listener, exc)
                return
            self._accepted_again()
            self._admit(conn, address)

    def _pause(self, listener: socket.socket, exc: OSError) -> None:
        """Out of descriptors, most likely: retry after a backoff instead of on every loop turn."""
        if not self.starved:
            self.starved = True
            log.warning("cannot accept connections (%s) with %d open; retrying in up to %.1f s",
                        exc.strerror or exc, len(self.owners), ACCEPT_BACKOFF_MAX)
        io_loop = tornado.ioloop.IOLoop.current()
        io_loop.remove_handler(listener)
        self.resume = io_loop.call_later(self.backoff, self._resume)
        self.backoff = min(self.backoff * 2, ACCEPT_BACKOFF_MAX)

    def _resume(self) -> None:
        self.resume = None
        if self.listener is not None:
            tornado.ioloop.IOLoop.current().add_handler(self.listener, self._accept_ready, tornado.ioloop.IOLoop.READ)

    def _accepted_again(self) -> None:
        self.backoff = ACCEPT_BACKOFF_MIN
        if self.starved:
            self.starved = False
            log.info("accepting connections again")

    def _admit(self, conn: socket.socket, address: Any) -> None:
        try:
            uid = peer_credentials(conn).uid
        except OSError:
            conn.close()
            return
        reason = self._over_cap(uid)
        if reason is not None:
            self._refuse(conn, reason)
            return
        stream = JsonErrorStream(
            conn, max_buffer_size=self.max_buffer_size, read_chunk_size=self.read_chunk_size,
        )
        self.owners[stream] = uid
        self.per_uid[uid] += 1
        self.handle_stream(stream, address)

    def _over_cap(self, uid: int) -> str | None:
        """Why a connection from `uid` is refused, or None.

        The per-uid cap keeps one user from crowding out the others; root
        administers cgd and has none (as with the other per-user limits).
        The global cap holds for root too: it is what keeps cgd's own
        descriptors from running out, whoever opens the connections.
        """
        if len(self.owners) >= self.max_connections:
            return f"too many connections to cgd ({len(self.owners)} open); try again later"
        if uid != 0 and self.per_uid[uid] >= self.max_per_uid:
            return f"too many connections from uid {uid} ({self.per_uid[uid]} open); close some and retry"
        return None

    def _refuse(self, conn: socket.socket, reason: str) -> None:
        """Answer 503 and close; a flood gets one warning a minute, not one per connection."""
        self.refused += 1
        now = time.monotonic()
        if now - self.refusal_logged >= REFUSAL_LOG_INTERVAL:
            log.warning("refused %d connection(s) since the last warning, the latest: %s", self.refused, reason)
            self.refused = 0
            self.refusal_logged = now
        try:
            conn.setblocking(False)
            conn.send(refusal(reason))
            # Drop what the client already sent: closing over unread data
            # would make its read of the 503 fail with ECONNRESET.
            conn.recv(65536)
        except OSError:
            pass
        finally:
            conn.close()

    def on_close(self, server_conn: object) -> None:
        super().on_close(server_conn)
        stream = cast(tornado.http1connection.HTTP1ServerConnection, server_conn).stream
        uid = self.owners.pop(stream, None)
        if uid is None:
            return
        self.per_uid[uid] -= 1
        if self.per_uid[uid] <= 0:
            del self.per_uid[uid]


def bind_socket(path: Path, system: bool) -> socket.socket:
    """Bind cgd's socket with the right owner and mode before anyone can connect.

    Bound before cgd touches any worker, so a socket it cannot have fails the
    start with nothing done; clients that connect before `listen` serves it
    wait in the backlog."""
    path.parent.mkdir(parents=True, exist_ok=True)
    refuse_live_socket(path)
    mode = 0o600
    group_id = None
    if system:
        try:
            group_id = grp.getgrnam("computegroups").gr_gid
            mode = 0o660
        except KeyError:
            pass
    old = os.umask(0o177)
    try:
        sock = tornado.netutil.bind_unix_socket(str(path), mode=mode, backlog=512)
    finally:
        os.umask(old)
    if group_id is not None:
        os.chown(path, -1, group_id)
    return sock


def listen(app: CgdApp, sock: socket.socket, max_per_uid: int = MAX_CONNECTIONS_PER_UID) -> CgdHTTPServer:
    """Serve the API on the socket `bind_socket` bound."""
    server = CgdHTTPServer(
        app.application(), max_body_size=256 * MAX_BODY, max_header_size=64 * 1024,
        idle_connection_timeout=60, body_timeout=30, max_connections=connection_cap(), max_per_uid=max_per_uid,
    )
    server.serve(sock)
    return server


def bind_metrics(address: str) -> list[socket.socket]:
    """Bind the TCP address of `/metrics` (before cgd touches any worker, as `bind_socket`).

    Raises OSError when the address cannot be bound."""
    from computegroups.daemon.model.config import split_listen

    host, port = split_listen(address)
    return tornado.netutil.bind_sockets(port, host)


def listen_metrics(app: CgdApp, sockets: list[socket.socket]) -> tuple[tornado.httpserver.HTTPServer, str]:
    """Serve `/metrics` on TCP for Prometheus, and nothing else: no request there has an identity.

    Returns the server and the address bound (port 0 asks the kernel for one).
    """
    server = tornado.httpserver.HTTPServer(app.metrics_application(), idle_connection_timeout=60,
                                           body_timeout=10, max_body_size=MAX_BODY)
    server.add_sockets(sockets)
    bound_host, bound_port = sockets[0].getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return server, f"{shown}:{bound_port}"
