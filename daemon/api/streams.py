"""The two routes that are not one JSON answer: `/metrics` (Prometheus's text) and
`/v1/events` (newline-delimited JSON, streamed as events happen).

Both only transport: the metrics are the core's registry rendered, the
events the core's ring read from the caller's cursor, filtered by who
the socket says the caller is.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import tornado.iostream
import tornado.web

from computegroups.daemon.api.handlers import ApiHandler
from computegroups.daemon.core.eventlog import Event, visible_to
from computegroups.daemon.core.metrics import CONTENT_TYPE, exposition
from computegroups.daemon.model.errors import BadRequest

if TYPE_CHECKING:
    from computegroups.daemon.api.server import CgdApp

WAKE_S = 30.0
"""How long a follower sleeps without events before it looks whether it should stop."""


class MetricsHandler(ApiHandler):
    """`GET /metrics` on the Unix socket."""

    async def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE)
        self.finish(exposition(self.app.registry))


class TcpMetricsHandler(tornado.web.RequestHandler):
    """`GET /metrics` on the optional TCP listener: the one route there, and no identity to read."""

    def initialize(self, app: CgdApp) -> None:
        self.app = app

    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE)
        self.finish(exposition(self.app.registry))


class EventsHandler(ApiHandler):
    """`GET /v1/events?since=SEQ&follow=true|false`: the kept events after `since` the caller may
    see, then (following) each new one as it happens, one JSON object per line, flushed per event."""

    closed = False

    async def get(self) -> None:
        try:
            since = self.query_int("since")
            follow = self._flag("follow", True)
            self.app.manager.keeper.events.check_since(since)
        except BadRequest as exc:
            self._error(exc)
            self.finish()
            return
        caller = self.caller
        events = self.app.manager.keeper.events
        visible = visible_to(caller.uid, caller.is_root)
        self.set_header("Content-Type", "application/x-ndjson")
        self.set_header("Cache-Control", "no-store")
        cursor = since
        try:
            while not self.closed:
                found, gap = events.after(cursor, visible)
                cursor = events.last_seq
                for event in ([gap] if gap else []) + found:
                    await self._send(event)
                if not follow or events.closed:
                    break
                if not found and gap is None:
                    await self.flush()  # headers out at once, so a follower knows it is connected
                await events.wait(cursor, WAKE_S)
        except tornado.iostream.StreamClosedError:
            return
        self.finish()

    async def _send(self, event: Event) -> None:
        self.write(json.dumps(event, sort_keys=True) + "\n")
        await self.flush()

    def on_connection_close(self) -> None:
        super().on_connection_close()
        self.closed = True
        self.app.manager.keeper.events.wake()

    def _flag(self, name: str, default: bool) -> bool:
        raw = self.get_query_argument(name, None)
        if raw is None:
            return default
        if raw.lower() in ("1", "true", "yes"):
            return True
        if raw.lower() in ("0", "false", "no"):
            return False
        raise BadRequest(f"{name}: expected true or false, got {raw[:40]!r}")
