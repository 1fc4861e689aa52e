"""The routes' handlers: each decodes its request into the model and calls one manager operation.

The caller's identity comes from the socket (SO_PEERCRED), never from the
request; any failure becomes a JSON error and the daemon keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

import msgspec
import tornado.http1connection
import tornado.httpserver
import tornado.ioloop
import tornado.iostream
import tornado.netutil
import tornado.web

from computegroups.daemon.api.body import MAX_BODY, MAX_DEPTH, PayloadTooLarge, duplicate_key, json_depth_ok, not_json
from computegroups.daemon.api.listener import peer_credentials
from computegroups.daemon.core.keeper import STOPPING
from computegroups.daemon.core.manager import Caller
from computegroups.daemon.model.decoding import ModelError, decode_json
from computegroups.daemon.model.errors import BadRequest, ManagerError, StateUnwritable, Stopping, Unavailable
from computegroups.daemon.model.requests import (
    ComponentRequest,
    GroupRequest,
    ReservationRequest,
    RestartRequest,
    ScaleRequest,
    check_name,
)
from computegroups.statefiles.errors import StateLockedError

if TYPE_CHECKING:
    from computegroups.daemon.api.server import CgdApp

log = logging.getLogger("cgd.server")


T = TypeVar("T")


@tornado.web.stream_request_body
class ApiHandler(tornado.web.RequestHandler):
    """Common ground: limits, identity, JSON in and out, errors as JSON."""

    def initialize(self, app: CgdApp) -> None:
        self.app = app
        self.chunks: list[bytes] = []
        self.size = 0
        self.too_large = False

    def prepare(self) -> None:
        self.app.started(self)
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

    async def run(self, action: Callable[[], Any], status: int = 200, *, durable: bool = True) -> None:
        """Do `action` and answer, once what it changed is durable (a failed request may have changed some);
        `durable=False` only for an answer that changes nothing and must come when nothing can be durable."""
        if self._finished:
            return
        try:
            try:
                result = action()
                if hasattr(result, "__await__"):
                    result = await result
            finally:
                if durable:
                    await self.app.manager.keeper.durable()
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

    def on_finish(self) -> None:
        self.app.ended(self)

    def on_connection_close(self) -> None:
        self.app.ended(self)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None))[1]
        if status_code == 500 and exc is None and _cancelled():
            # tornado answers 500 for a handler whose own task was cancelled: here only the
            # end of cgd's loop does that, to a request cgd's stop did not see answered in time.
            self._error(Stopping(STOPPING))
            self.finish()
            return
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

    def stop_timeout(self) -> float | None:
        """`?stop_timeout=S`: a release's grace before its workers are killed, instead of their own."""
        return self.query_seconds("stop_timeout")

    def query_seconds(self, name: str, hint: str = "") -> float | None:
        """A duration in seconds, 0 to an hour: what a request may make cgd wait."""
        raw = self.get_query_argument(name, None)
        if raw is None:
            return None
        try:
            seconds = float(raw)
        except ValueError:
            raise BadRequest(f"{name}: expected seconds, got {raw[:40]!r}") from None
        if not 0 <= seconds <= 3600:
            raise BadRequest(f"{name}: must be between 0 and 3600 seconds{hint}")
        return seconds

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
        """Answered even once the state cannot be made durable: saying so (`state`) is what it is for."""
        try:
            await self.app.manager.keeper.durable()
        except StateUnwritable:
            await self.run(self.app.health, durable=False)
            return
        await self.run(self.app.health)


class StateLossHandler(ApiHandler):
    async def post(self) -> None:
        await self.run(lambda: self.app.manager.acknowledge_state_loss(self.caller))


class ComponentsHandler(ApiHandler):
    async def get(self) -> None:
        await self.run(lambda: {"components": self.app.manager.components(self.query_int("owner"))})

    async def post(self) -> None:
        await self.run(lambda: self.app.manager.allocate(self.caller, self.decode(ComponentRequest)), 201)

    async def delete(self) -> None:
        """`?all=true`: all the caller's components; `?name=A&name=B`: those components and reservations,
        all checked before any goes."""
        names = self.get_query_arguments("name")
        everything = self.get_query_argument("all", "") in ("true", "1")
        if everything == bool(names):
            await self.run(lambda: _raise(BadRequest(
                "add ?all=true to release all your components, or ?name=A&name=B to release those")))
        elif everything:
            if self.get_query_argument("stop_timeout", None) is not None:
                await self.run(lambda: _raise(BadRequest("stop_timeout: only with ?name=, not with ?all=true")))
                return
            await self.run(lambda: self.app.manager.release_all(self.caller))
        else:
            await self.run(lambda: self.app.manager.release_many(
                self.caller, [check_name(n) for n in names], self.stop_timeout()))


class ComponentHandler(ApiHandler):
    async def get(self, name: str) -> None:
        await self.run(lambda: self.app.manager.component(check_name(name)))

    async def delete(self, name: str) -> None:
        await self.run(lambda: self.app.manager.release(self.caller, check_name(name), self.stop_timeout()))


class WaitHandler(ApiHandler):
    """`GET /v1/components/<name>/wait?until=ended|placed&timeout=S`: a long poll, answered when reached or at S."""

    async def get(self, name: str) -> None:
        def wait() -> Any:
            until = self.get_query_argument("until", "ended")
            if until not in ("ended", "placed"):
                raise BadRequest("until: must be ended or placed")
            timeout = self.query_seconds("timeout", " (ask again to wait longer)")
            return self.app.manager.wait_for(check_name(name), until, 60.0 if timeout is None else timeout)
        await self.run(wait)


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
        def groups() -> dict[str, Any]:
            text = {key: self.get_query_argument(key, None) for key in GROUP_TEXT_FILTERS}
            return {"groups": self.app.manager.groups(gpu=self.query_int("gpu"), **text)}
        await self.run(groups)

    async def post(self) -> None:
        await self.run(lambda: self.app.manager.create_group(self.caller, self.decode(GroupRequest).claim), 201)


GROUP_TEXT_FILTERS = ("component", "state", "model", "pool", "uuid", "owner", "deployment")
"""`GET /v1/groups` filters besides `gpu` (an index): every field a group can be found by."""


class GroupHandler(ApiHandler):
    async def get(self, gid: str) -> None:
        from computegroups.daemon.core.views import group_view

        await self.run(lambda: group_view(self.app.manager.doc, self.app.manager.group_record(gid)))

    async def delete(self, gid: str) -> None:
        await self.run(lambda: self.app.manager.delete_group(self.caller, gid))


class GroupDeallocateHandler(ApiHandler):
    async def post(self, gid: str) -> None:
        await self.run(lambda: self.app.manager.deallocate_group(self.caller, gid))


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


def _cancelled() -> bool:
    """Whether the running task is being cancelled (the handler's own, when tornado answers for it)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
