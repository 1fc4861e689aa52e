"""HTTP+JSON on a Unix socket: transport only, every decision is the manager's.

Each request body is checked before the manager sees it: size and nesting
limits, duplicate keys, then decoded once into the typed model (types,
ranges, unknown fields). The caller's identity comes from the socket
(SO_PEERCRED), never from the request. Any failure becomes a JSON error and
the daemon keeps serving: no request can crash it.

The parts: body.py (limits before decoding), handlers.py (one per route),
listener.py (the socket); this module holds the application and its routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import tornado.http1connection
import tornado.httpserver
import tornado.ioloop
import tornado.iostream
import tornado.netutil
import tornado.web

from computegroups import __version__
from computegroups.daemon.api.handlers import (
    ComponentHandler,
    ComponentsHandler,
    EnvHandler,
    GpuDrainHandler,
    GroupDeallocateHandler,
    GroupDrainHandler,
    GroupHandler,
    GroupsHandler,
    GroupUndrainHandler,
    HealthHandler,
    LogsHandler,
    MachineHandler,
    NotFoundHandler,
    ReservationHandler,
    ReservationsHandler,
    RestartHandler,
    ScaleHandler,
    StateLossHandler,
    StatusHandler,
    VersionHandler,
    WaitHandler,
)
from computegroups.daemon.api.streams import EventsHandler, MetricsHandler, TcpMetricsHandler
from computegroups.daemon.core.manager import Manager

log = logging.getLogger("cgd.server")


class CgdApp:
    """The facts the server needs beyond the manager, and the routes."""

    def __init__(self, manager: Manager, health, state_dir: Path,
                 machine_dict: dict[str, Any], extra_routes: list | None = None) -> None:
        self.manager = manager
        self.health_monitor = health
        self.state_dir = state_dir
        self._machine = machine_dict
        self.extra_routes = extra_routes or []
        self.metrics_listen: str | None = None
        """The TCP address `/metrics` is also served on, once bound (the port chosen when 0 was asked)."""
        self.in_flight: set[tornado.web.RequestHandler] = set()
        """The requests being answered: cgd's stop lets them finish before it tears down what they use."""
        self._all_answered = asyncio.Event()

    def started(self, request: tornado.web.RequestHandler) -> None:
        self.in_flight.add(request)
        self._all_answered.clear()

    def ended(self, request: tornado.web.RequestHandler) -> None:
        """`request` is answered, or its client went away."""
        self.in_flight.discard(request)
        if not self.in_flight:
            self._all_answered.set()

    async def answered(self, within: float) -> None:
        """Return once every request in flight is answered, or after `within` seconds.

        Called when cgd stops, after the waits were ended (`StateKeeper.stop_waits`)
        and the event streams closed: those answer at once, a short request soon; one
        still going after `within` is answered `stopping` when the loop ends.
        """
        if self.in_flight:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._all_answered.wait(), within)

    @property
    def registry(self):
        """The metrics registry: the core's counters and its collector of the state."""
        return self.manager.keeper.instruments.registry

    def version(self) -> dict[str, Any]:
        m = self.manager.keeper.machine
        events = self.manager.keeper.events
        return {"version": __version__, "api": 1, "pid": os.getpid(), "state_dir": str(self.state_dir),
                "machine": {"hostname": m.hostname, "source": m.source, "gpus": len(m.gpus)},
                "metrics_listen": self.metrics_listen,
                "events": {"epoch": events.epoch, "last_seq": events.last_seq, "first_kept": events.first_kept()}}

    def machine_dict(self) -> dict[str, Any]:
        return self._machine

    def status(self) -> dict[str, Any]:
        from computegroups.daemon.core.views import components_at_a_glance, gpu_status, group_view

        doc = self.manager.doc
        monitor = self.health_monitor
        views = self.manager.components()
        return {
            "generation": doc.generation,
            "gpus": gpu_status(self.manager.keeper.machine, doc, monitor.as_dict(), monitor.measured(),
                               monitor.used_by_replica(), self.manager.worker_pids(),
                               {v["name"]: v["state"] for v in views}, self.manager.held_by_lost()),
            "lost_groups": [group_view(doc, g) for g in doc.groups.values() if g.state == "lost"],
            "components": components_at_a_glance(views),
            "state_loss": self.manager.state_loss,
        }

    def health(self) -> dict[str, Any]:
        facts = self.health_monitor.as_dict()
        gpus = [{"index": g.index, "health": facts.get(g.index, {}).get("health", "ok"),
                 "reasons": facts.get(g.index, {}).get("reasons", [])}
                for g in self.manager.keeper.machine.gpus]
        expected, running = self.manager.worker_counts()
        degraded = any(g["health"] != "ok" for g in gpus) or bool(self.manager.state_loss)
        refusal = self.manager.keeper.refusal
        return {"status": "failing" if refusal else "degraded" if degraded else "ok", "gpus": gpus,
                "state": {"writable": refusal is None, "error": refusal},
                "state_loss": self.manager.state_loss,
                "last_sample": self.health_monitor.last_sample,
                "interval_s": self.health_monitor.config.interval_s,
                "workers": {"expected": expected, "running": running},
                "worker_tracking": self.manager.supervisor.tracking.as_dict()}

    def application(self) -> tornado.web.Application:
        kw = {"app": self}
        name = r"([^/]+)"
        routes = [
            (r"/v1/version", VersionHandler, kw),
            (r"/metrics", MetricsHandler, kw),
            (r"/v1/events", EventsHandler, kw),
            (r"/v1/machine", MachineHandler, kw),
            (r"/v1/status", StatusHandler, kw),
            (r"/v1/health", HealthHandler, kw),
            (r"/v1/state/acknowledge-loss", StateLossHandler, kw),
            (r"/v1/components", ComponentsHandler, kw),
            (rf"/v1/components/{name}", ComponentHandler, kw),
            (rf"/v1/components/{name}/scale", ScaleHandler, kw),
            (rf"/v1/components/{name}/wait", WaitHandler, kw),
            (rf"/v1/components/{name}/restart", RestartHandler, kw),
            (rf"/v1/components/{name}/env", EnvHandler, kw),
            (rf"/v1/components/{name}/logs", LogsHandler, kw),
            (r"/v1/groups", GroupsHandler, kw),
            (rf"/v1/groups/{name}", GroupHandler, kw),
            (rf"/v1/groups/{name}/deallocate", GroupDeallocateHandler, kw),
            (rf"/v1/groups/{name}/drain", GroupDrainHandler, kw),
            (rf"/v1/groups/{name}/undrain", GroupUndrainHandler, kw),
            (r"/v1/gpus/([0-9]{1,4})/(drain|undrain)", GpuDrainHandler, kw),
            (r"/v1/reservations", ReservationsHandler, kw),
            (rf"/v1/reservations/{name}", ReservationHandler, kw),
            *[(path, handler, kw) for path, handler in self.extra_routes],
            (r"(.*)", NotFoundHandler, kw),
        ]
        return tornado.web.Application(routes, default_handler_class=None)

    def metrics_application(self) -> tornado.web.Application:
        """The TCP listener's application: `/metrics` alone, for Prometheus."""
        return tornado.web.Application([(r"/metrics", TcpMetricsHandler, {"app": self})])
