"""HTTP+JSON on a Unix socket: transport only, every decision is the manager's.

Each request body is checked before the manager sees it: size and nesting
limits, duplicate keys, then decoded once into the typed model (types,
ranges, unknown fields). The caller's identity comes from the socket
(SO_PEERCRED), never from the request. Any failure becomes a JSON error and
the daemon keeps serving: no request can crash it.
"""

from __future__ import annotations

import grp
import json
import logging
import os
import resource
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast, overload

import msgspec
import tornado.http1connection
import tornado.httpserver
import tornado.ioloop
import tornado.iostream
import tornado.netutil
import tornado.web

from computegroups import __version__
from computegroups.daemon.core.manager import Caller, Manager
from computegroups.daemon.model.decoding import ModelError, decode_json
from computegroups.daemon.model.errors import BadRequest, ManagerError, Unavailable
from computegroups.daemon.model.requests import (
    ComponentRequest,
    GroupRequest,
    ReservationRequest,
    RestartRequest,
    ScaleRequest,
    check_name,
)
from computegroups.statefiles.errors import StateLockedError

log = logging.getLogger("cgd.server")

MAX_BODY = 1024 * 1024
MAX_DEPTH = 32
MAX_CONNECTIONS = 256
MAX_CONNECTIONS_PER_UID = 64
# Connections accepted per wakeup, so a flood cannot starve the rest of the loop.
ACCEPT_BATCH = 128
ACCEPT_BACKOFF_MIN = 0.1
ACCEPT_BACKOFF_MAX = 1.0
PROBE_TIMEOUT = 2.0
REFUSAL_LOG_INTERVAL = 60.0
T = TypeVar("T")


class PayloadTooLarge(ManagerError):
    status = 413
    code = "payload_too_large"


def json_depth_ok(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """Refuse deep nesting before json.loads recurses into it."""
    depth = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return False
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return True


def duplicate_key(raw: bytes) -> str | None:
    """The first key given twice in one object, which msgspec (like json) would let the last win.

    The standard parser's C scanner with a hook per object: about as fast as
    the msgspec decode itself (6 us for a typical body, 1.3 ms for 300 KiB of
    env), small next to the state commit every such request makes. A body
    with fewer than two colons cannot hold two keys and is not parsed twice.
    """
    if raw.count(b":") < 2:
        return None
    found: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) != len(items) and not found:
            seen: set[str] = set()
            for key, _ in items:
                if key in seen:
                    found.append(key)
                    break
                seen.add(key)
        return obj

    try:
        json.loads(raw, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None  # not JSON at all: the decoder says so
    return found[0][:80] if found else None


def not_json(raw: bytes, exc: Exception) -> BadRequest:
    """Why a body is not JSON, in the words of the standard parser (only errors pay for the second look)."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as error:
        return BadRequest(f"body: not valid JSON ({str(error)[:120]})")
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return BadRequest("body: a string holds a lone UTF-16 surrogate, which is not text")
    return BadRequest(f"body: not valid JSON ({str(exc)[:120]})")


def peer_credentials(sock: socket.socket) -> Caller:
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", data)
    return Caller(pid=pid, uid=uid, gid=gid)


@tornado.web.stream_request_body
class ApiHandler(tornado.web.RequestHandler):
    """Common ground: limits, identity, JSON in and out, errors as JSON."""

    def initialize(self, app: CgdApp) -> None:
        self.app = app
        self.chunks: list[bytes] = []
        self.size = 0
        self.too_large = False

    def prepare(self) -> None:
        length = self.request.headers.get("Content-Length")
        if length is not None:
            try:
                too_big = int(length) > MAX_BODY
            except ValueError:
                raise tornado.web.HTTPError(400, "Content-Length is not a number") from None
            # Read and drop the body rather than answering early: a client still
            # sending would see a broken pipe instead of the 413.
            self.too_large = too_big

    def data_received(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > MAX_BODY:
            self.too_large = True
            self.chunks.clear()
        elif not self.too_large:
            self.chunks.append(chunk)

    @property
    def caller(self) -> Caller:
        connection = self.request.connection
        if not isinstance(connection, tornado.http1connection.HTTP1Connection):
            raise TypeError(f"cgd serves HTTP/1 on a Unix socket only, not over {type(connection).__name__}")
        return peer_credentials(connection.stream.socket)

    def raw_body(self) -> bytes:
        """The body, within the limits and free of duplicate keys, not yet decoded."""
        if self.too_large:
            raise PayloadTooLarge(f"body is over {MAX_BODY} bytes")
        raw = b"".join(self.chunks)
        if not raw.strip():
            raise BadRequest("body: expected a JSON object")
        if not json_depth_ok(raw):
            raise BadRequest(f"body: nested deeper than {MAX_DEPTH} levels")
        duplicate = duplicate_key(raw)
        if duplicate is not None:
            raise BadRequest(f"{duplicate}: the key appears twice in one object")
        return raw

    def decode(self, type_: type[T]) -> T:
        """The body decoded straight into the model: the one check every request gets."""
        raw = self.raw_body()
        try:
            return decode_json(raw, type_)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise not_json(raw, exc) from None

    def reply(self, payload: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(payload, sort_keys=True) + "\n")

    def _error(self, exc: ManagerError) -> None:
        self.set_status(exc.status)
        self.set_header("Content-Type", "application/json")
        self.write(json.dumps({"error": {"code": exc.code, "message": str(exc)}}) + "\n")

    async def run(self, action: Callable[[], Any], status: int = 200) -> None:
        if self._finished:
            return
        try:
            result = action()
            if hasattr(result, "__await__"):
                result = await result
        except ModelError as exc:
            self._error(BadRequest(str(exc)))
            self.finish()
            return
        except ManagerError as exc:
            self._error(exc)
            self.finish()
            return
        except StateLockedError as exc:
            self._error(Unavailable(str(exc)))
            self.finish()
            return
        self.reply(result, status)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None))[1]
        if isinstance(exc, tornado.web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        elif status_code == 405:
            message = f"{self.request.method} is not allowed on {self.request.path}"
        elif status_code >= 500:
            log.error("internal error on %s %s", self.request.method, self.request.path,
                      exc_info=kwargs.get("exc_info"))
            message = "internal error: see cgd's log"
        else:
            message = self._reason
        codes = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": {"code": codes.get(status_code, "internal"), "message": message}}) + "\n")

    @overload
    def query_int(self, name: str) -> int | None: ...

    @overload
    def query_int(self, name: str, default: int) -> int: ...

    def query_int(self, name: str, default: int | None = None) -> int | None:
        raw = self.get_query_argument(name, None)
        if raw is None:
            return default
        try:
            return int(raw)
        except ValueError:
            raise BadRequest(f"{name}: expected an integer, got {raw[:40]!r}") from None


class RouteNotFound(ManagerError):
    status = 404
    code = "not_found"


class NotFoundHandler(ApiHandler):
    async def get(self, path: str) -> None:
        await self.run(lambda: _raise(RouteNotFound(f"no endpoint {path[:80]!r}: see docs/api.md")))

    post = delete = put = patch = get


class VersionHandler(ApiHandler):
    async def get(self) -> None:
        await self.run(self.app.version)


class MachineHandler(ApiHandler):
    async def get(self) -> None:
        await self.run(self.app.machine_dict)


class StatusHandler(ApiHandler):
    async def get(self) -> None:
        await self.run(self.app.status)


class HealthHandler(ApiHandler):
    async def get(self) -> None:
        await self.run(self.app.health)


class ComponentsHandler(ApiHandler):
    async def get(self) -> None:
        await self.run(lambda: {"components": self.app.manager.components(self.query_int("owner"))})

    async def post(self) -> None:
        await self.run(lambda: self.app.manager.allocate(self.caller, self.decode(ComponentRequest)), 201)

    async def delete(self) -> None:
        if self.get_query_argument("all", "") not in ("true", "1"):
            await self.run(lambda: _raise(BadRequest("add ?all=true to release all your components")))
            return
        await self.run(lambda: self.app.manager.release_all(self.caller))


class ComponentHandler(ApiHandler):
    async def get(self, name: str) -> None:
        await self.run(lambda: self.app.manager.component(check_name(name)))

    async def delete(self, name: str) -> None:
        await self.run(lambda: self.app.manager.release(self.caller, check_name(name)))


class ScaleHandler(ApiHandler):
    async def post(self, name: str) -> None:
        await self.run(lambda: self.app.manager.scale(
            self.caller, check_name(name), self.decode(ScaleRequest).replicas))


class RestartHandler(ApiHandler):
    async def post(self, name: str) -> None:
        await self.run(lambda: self.app.manager.restart(
            self.caller, check_name(name), self.decode(RestartRequest).replica))


class EnvHandler(ApiHandler):
    async def get(self, name: str) -> None:
        def env() -> dict[str, Any]:
            replica = self.query_int("replica", 0)
            return {"name": name, "replica": replica,
                    "env": self.app.manager.env(self.caller, check_name(name), replica)}
        await self.run(env)


class LogsHandler(ApiHandler):
    async def get(self, name: str) -> None:
        def logs() -> dict[str, Any]:
            replica = self.query_int("replica", 0)
            stream = self.get_query_argument("stream", "stdout")
            if stream not in ("stdout", "stderr"):
                raise BadRequest("stream: must be stdout or stderr")
            tail, offset = self.query_int("tail"), self.query_int("offset")
            if (tail is not None and tail < 0) or (offset is not None and offset < 0):
                raise BadRequest("tail and offset must be >= 0")
            return self.app.manager.logs(self.caller, check_name(name), replica, stream, tail, offset)
        await self.run(logs)


class GroupsHandler(ApiHandler):
    async def get(self) -> None:
        await self.run(lambda: {"groups": self.app.manager.groups(
            self.get_query_argument("component", None), self.get_query_argument("state", None),
            self.query_int("gpu"))})

    async def post(self) -> None:
        await self.run(lambda: self.app.manager.create_group(self.caller, self.decode(GroupRequest).claim), 201)


class GroupHandler(ApiHandler):
    async def get(self, gid: str) -> None:
        from computegroups.daemon.core.views import group_view

        await self.run(lambda: group_view(self.app.manager.doc, self.app.manager.group_record(gid)))

    async def delete(self, gid: str) -> None:
        await self.run(lambda: self.app.manager.delete_group(self.caller, gid))


class GroupDrainHandler(ApiHandler):
    async def post(self, gid: str) -> None:
        await self.run(lambda: self.app.manager.drain_group(self.caller, gid))


class GroupUndrainHandler(ApiHandler):
    async def post(self, gid: str) -> None:
        await self.run(lambda: self.app.manager.undrain_group(self.caller, gid))


class GpuDrainHandler(ApiHandler):
    async def post(self, index: str, action: str) -> None:
        await self.run(lambda: self.app.manager.drain_gpu(self.caller, int(index), action == "drain"))


class ReservationsHandler(ApiHandler):
    async def get(self) -> None:
        await self.run(lambda: {"reservations": self.app.manager.reservations()})

    async def post(self) -> None:
        await self.run(lambda: self.app.manager.reserve(self.caller, self.decode(ReservationRequest)), 201)


class ReservationHandler(ApiHandler):
    async def delete(self, name: str) -> None:
        await self.run(lambda: self.app.manager.unreserve(self.caller, check_name(name)))


def _raise(exc: Exception) -> Any:
    raise exc


class CgdApp:
    """The facts the server needs beyond the manager, and the routes."""

    def __init__(self, manager: Manager, health, state_dir: Path,
                 machine_dict: dict[str, Any], extra_routes: list | None = None) -> None:
        self.manager = manager
        self.health_monitor = health
        self.state_dir = state_dir
        self._machine = machine_dict
        self.extra_routes = extra_routes or []

    def version(self) -> dict[str, Any]:
        m = self.manager.keeper.machine
        return {"version": __version__, "api": 1, "pid": os.getpid(), "state_dir": str(self.state_dir),
                "machine": {"hostname": m.hostname, "source": m.source, "gpus": len(m.gpus)}}

    def machine_dict(self) -> dict[str, Any]:
        return self._machine

    def status(self) -> dict[str, Any]:
        from computegroups.daemon.core.views import gpu_status, group_view

        doc = self.manager.doc
        return {
            "generation": doc.generation,
            "gpus": gpu_status(self.manager.keeper.machine, doc, self.health_monitor.as_dict()),
            "lost_groups": [group_view(doc, g) for g in doc.groups.values() if g.state == "lost"],
        }

    def health(self) -> dict[str, Any]:
        facts = self.health_monitor.as_dict()
        gpus = [{"index": g.index, "health": facts.get(g.index, {}).get("health", "ok"),
                 "reasons": facts.get(g.index, {}).get("reasons", [])}
                for g in self.manager.keeper.machine.gpus]
        expected, running = self.manager.worker_counts()
        degraded = any(g["health"] != "ok" for g in gpus)
        return {"status": "degraded" if degraded else "ok", "gpus": gpus,
                "last_sample": self.health_monitor.last_sample,
                "workers": {"expected": expected, "running": running}}

    def application(self) -> tornado.web.Application:
        kw = {"app": self}
        name = r"([^/]+)"
        routes = [
            (r"/v1/version", VersionHandler, kw),
            (r"/v1/machine", MachineHandler, kw),
            (r"/v1/status", StatusHandler, kw),
            (r"/v1/health", HealthHandler, kw),
            (r"/v1/components", ComponentsHandler, kw),
            (rf"/v1/components/{name}", ComponentHandler, kw),
            (rf"/v1/components/{name}/scale", ScaleHandler, kw),
            (rf"/v1/components/{name}/restart", RestartHandler, kw),
            (rf"/v1/components/{name}/env", EnvHandler, kw),
            (rf"/v1/components/{name}/logs", LogsHandler, kw),
            (r"/v1/groups", GroupsHandler, kw),
            (rf"/v1/groups/{name}", GroupHandler, kw),
            (rf"/v1/groups/{name}/drain", GroupDrainHandler, kw),
            (rf"/v1/groups/{name}/undrain", GroupUndrainHandler, kw),
            (r"/v1/gpus/([0-9]{1,4})/(drain|undrain)", GpuDrainHandler, kw),
            (r"/v1/reservations", ReservationsHandler, kw),
            (rf"/v1/reservations/{name}", ReservationHandler, kw),
            *[(path, handler, kw) for path, handler in self.extra_routes],
            (r"(.*)", NotFoundHandler, kw),
        ]
        return tornado.web.Application(routes, default_handler_class=None)


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


def refusal(message: str) -> bytes:
    """A complete HTTP 503 with cgd's JSON error, sent before the request is even read."""
    body = json.dumps({"error": {"code": "unavailable", "message": message}}) + "\n"
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return (head + body).encode()


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
        stream = tornado.iostream.IOStream(
            conn, max_buffer_size=self.max_buffer_size, read_chunk_size=self.read_chunk_size,
        )
        self.owners[stream] = uid
        self.per_uid[uid] += 1
        self.handle_stream(stream, address)

    def _over_cap(self, uid: int) -> str | None:
        if len(self.owners) >= self.max_connections:
            return f"too many connections to cgd ({len(self.owners)} open); try again later"
        if self.per_uid[uid] >= self.max_per_uid:
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


def listen(app: CgdApp, path: Path, system: bool) -> CgdHTTPServer:
    """Bind the socket with the right owner and mode before anyone can connect."""
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
    server = CgdHTTPServer(
        app.application(), max_body_size=256 * MAX_BODY, max_header_size=64 * 1024,
        idle_connection_timeout=60, body_timeout=30, max_connections=connection_cap(),
    )
    server.serve(sock)
    return server
