"""Assembling cgd's parts in order, and taking them apart in reverse.

Start: private runtime directory, one-instance lock, machine, state,
worker tracking (a cgroup per worker, or marks), the socket and the
metrics address bound, supervisor on this loop, recovery of the previous
run's workers (and of what they left in their cgroups), health loop,
serving, watchdog and log rotation, READY=1.
Stop: STOPPING=1, close the socket, end the event streams and the long
polls (answered `stopping`: their clients reconnect to the next cgd) and
let the requests in flight be answered, stop the health loop, stop (or
keep) the workers (and remove their cgroups).

The listeners are bound before any worker is touched, so the commonest
failure (an address in use) ends the start with nothing done. A start that
fails once the supervisor runs takes the stop's path with `--keep-workers`:
the workers recovery adopted or started are recorded in the state, keep
running under their launch shims, and the next cgd adopts them, as after
`cgd --keep-workers`; a fault of cgd's own start never ends a user's work.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import tornado.httpserver

from computegroups import __version__
from computegroups.daemon import sdnotify
from computegroups.daemon.api.deployments import deployment_routes
from computegroups.daemon.api.listener import CgdHTTPServer, bind_metrics, bind_socket, listen, listen_metrics
from computegroups.daemon.api.server import CgdApp
from computegroups.daemon.core.eventlog import EPOCH_FILE, EventLog, next_epoch
from computegroups.daemon.core.health import HealthMonitor
from computegroups.daemon.core.keeper import StateKeeper
from computegroups.daemon.core.manager import Manager
from computegroups.daemon.core.metrics import StateCollector
from computegroups.daemon.core.recovery import recover, shutdown
from computegroups.daemon.core.workers import INSTANCE_VAR, WorkerPaths, watcher_key
from computegroups.daemon.deployments.ops import Deployments
from computegroups.daemon.model.config import DaemonConfig
from computegroups.daemon.model.errors import ManagerError
from computegroups.daemon.model.refs import ReplicaRef
from computegroups.daemon.model.words import plural
from computegroups.daemon.paths import UnsafeDirectory, cgd_runtime_dir, own_dir
from computegroups.daemon.supervision import cgroups
from computegroups.daemon.supervision.cgroups import Tracking, TrackingUnavailable, choose_tracking
from computegroups.daemon.supervision.mps import MpsControl, MpsError
from computegroups.daemon.supervision.supervisor import Supervisor, WorkerExit, WorkerStart
from computegroups.daemon.supervision.worklogs import rotate_all
from computegroups.statefiles.errors import StateError
from computegroups.statefiles.store import StateStore

log = logging.getLogger("cgd")

ROTATE_PERIOD_S = 1.0
ANSWER_S = 5.0
"""How long a stop lets the requests in flight finish (a long poll is answered at once) before it goes on."""


@dataclass(frozen=True)
class Options:
    socket: Path
    state_dir: Path
    log_dir: Path
    runtime_dir: Path
    config: DaemonConfig
    simulate: str | None
    simulate_fallback: str | None
    keep_workers: bool
    system: bool
    metrics_listen: str | None = None
    """`cgd --metrics-listen`, over the configuration's `metrics_listen`."""


class StartupError(Exception):
    """cgd cannot start; the message says why and what to do."""


class InstanceLock:
    """One cgd per state directory, whatever its socket: the second one is told who holds it.

    The lock is held on the state directory itself, not on a file in it: a
    lock file deleted or replaced while cgd runs would let a second cgd lock
    a new one and act on the same state. The pid file only names the holder;
    it is created afresh, never through a link someone planted.
    """

    def __init__(self, state_dir: Path) -> None:
        self.pid_file = state_dir / "cgd.pid"
        self.state_dir = state_dir
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            try:
                pid = self.pid_file.read_text().strip()
            except OSError:
                pid = "?"
            raise StartupError(f"cgd already runs as pid {pid} for {self.state_dir}") from None
        self._fd = fd
        self.pid_file.unlink(missing_ok=True)
        out = os.open(self.pid_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(out, "w") as fh:
            fh.write(f"{os.getpid()}\n")

    def release(self) -> None:
        self.pid_file.unlink(missing_ok=True)
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the lock
            self._fd = None


def open_machine(opts: Options):
    """The gateway and machine, real or simulated, with the fallback rule.

    A simulated machine lists this cgd's workers (those carrying its
    CG_INSTANCE) as processes on their GPUs, when its machine or fault
    file asks for it.
    """
    from computegroups.topology import NvmlUnavailable, open_gateway
    from computegroups.topology.discovery import discover

    mark = (INSTANCE_VAR, str(opts.state_dir.resolve()))
    try:
        gateway = open_gateway(opts.simulate, worker_mark=mark)
    except NvmlUnavailable as exc:
        if not opts.simulate_fallback:
            raise StartupError(str(exc)) from None
        log.warning("no NVIDIA driver here (%s); running on the simulated machine %s",
                    exc.reason, opts.simulate_fallback)
        gateway = open_gateway(opts.simulate_fallback, worker_mark=mark)
    except (ValueError, OSError) as exc:
        raise StartupError(str(exc)) from None
    return gateway, discover(gateway)


def private_runtime_dir(opts: Options) -> Path:
    """Where cgd keeps role files, MPS pipes and circus's endpoints: a
    directory no one else can change, so a root cgd never writes through a
    symlink someone planted (see daemon/paths.py)."""
    try:
        return cgd_runtime_dir(opts.runtime_dir, opts.socket.name)
    except UnsafeDirectory as exc:
        raise StartupError(
            f"runtime directory {exc}; remove it or choose another --socket"
        ) from None


class Daemon:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.tasks: list[asyncio.Task] = []
        self.manager: Manager | None = None
        """Set once the supervisor runs: from then on a failed start has workers to leave behind."""
        self.health: HealthMonitor | None = None
        self.server: CgdHTTPServer | None = None
        self.app: CgdApp | None = None
        self.metrics_server: tornado.httpserver.HTTPServer | None = None

    async def start(self) -> None:
        opts = self.opts
        for directory, mode in ((opts.state_dir, 0o700), (opts.log_dir, 0o755)):
            # Only directories cgd creates get its modes; an existing one keeps
            # the mode its administrator chose, but one another user owns or
            # may write is refused: cgd (often root) writes its files there.
            directory.parent.mkdir(parents=True, exist_ok=True)
            try:
                own_dir(directory, mode)
            except UnsafeDirectory as exc:
                raise StartupError(f"{exc}: cgd keeps its state and logs only where no one else can "
                                   "change them (chown it to cgd's user and chmod go-w)") from None
        self.runtime_dir = private_runtime_dir(opts)
        self.instance = InstanceLock(opts.state_dir)
        self.instance.acquire()
        try:
            await self._start()
        except BaseException:
            self.instance.release()
            raise

    async def _start(self) -> None:
        opts = self.opts
        self.gateway, machine = open_machine(opts)
        problems = opts.config.allocator.pool_problems(len(machine.gpus))
        if problems:
            raise StartupError(f"{opts.config.source}: {'; '.join(problems)}")
        store = StateStore(opts.state_dir)
        try:
            events = EventLog(next_epoch(opts.state_dir), opts.config.events.keep)
        except OSError as exc:
            raise StartupError(f"cannot write {opts.state_dir / EPOCH_FILE}: {exc}") from None
        try:
            store.hold()  # cgd is the state's only writer while it runs; see StateStore.hold
            keeper = StateKeeper(machine, store, opts.config, events=events)
        except StateError as exc:
            store.let_go()
            raise StartupError(str(exc)) from None
        try:
            await self._track_and_serve(keeper)
        except BaseException:
            store.let_go()
            raise

    async def _track_and_serve(self, keeper: StateKeeper) -> None:
        opts = self.opts
        worker_paths = WorkerPaths(opts.log_dir, self.runtime_dir, str(opts.state_dir.resolve()))
        try:
            tracking = choose_tracking(opts.config.worker_tracking, worker_paths.instance)
        except TrackingUnavailable as exc:
            raise StartupError(str(exc)) from None
        log.info("%s", tracking.describe())
        try:
            await self._serve(keeper, worker_paths, tracking)
        except BaseException:
            with contextlib.suppress(OSError):  # a failed start leaves no empty cgroup directory behind
                cgroups.remove(tracking.path)
            raise

    async def _serve(self, keeper: StateKeeper, worker_paths: WorkerPaths, tracking: Tracking) -> None:
        sockets = self._bind()
        try:
            await self._recover_and_serve(keeper, worker_paths, tracking, *sockets)
        except BaseException as exc:
            log.error("start failed: %s", exc)
            await self._undo_start(sockets)
            raise

    def _bind(self) -> tuple[socket.socket, list[socket.socket]]:
        """cgd's socket and the metrics address, or StartupError before anything else is started."""
        opts = self.opts
        try:
            sock = bind_socket(opts.socket, opts.system)
        except OSError as exc:
            raise StartupError(f"socket {opts.socket}: {exc}") from None
        address = opts.metrics_listen or opts.config.metrics_listen
        if not address:
            return sock, []
        try:
            return sock, bind_metrics(address)
        except OSError as exc:
            sock.close()
            opts.socket.unlink(missing_ok=True)
            raise StartupError(f"metrics_listen {address}: {exc}") from None

    async def _undo_start(self, sockets: tuple[socket.socket, list[socket.socket]]) -> None:
        """After a failed start: the stop's path, keeping the workers for the next cgd (see above)."""
        for server in (self.server, self.metrics_server):
            if server is not None:
                server.stop()
        for sock in (sockets[0], *sockets[1]):
            sock.close()
        self.opts.socket.unlink(missing_ok=True)
        try:
            if self.health is not None:
                await self.health.stop()
            if self.manager is not None:
                await shutdown(self.manager, keep_workers=True)
        except Exception:
            log.exception("stopping after the failed start failed too")

    async def _recover_and_serve(self, keeper: StateKeeper, worker_paths: WorkerPaths, tracking: Tracking,
                                 sock: socket.socket, metrics_sockets: list[socket.socket]) -> None:
        from computegroups.topology.serialize import machine_to_dict
        from computegroups.topology.telemetry import Telemetry

        opts, machine = self.opts, keeper.machine
        # The supervisor and the manager need each other: the supervisor is
        # built first and reports nothing before `supervisor.start()`, which
        # runs once the manager exists.
        manager: Manager | None = None

        def on_exit(event: WorkerExit) -> None:
            assert manager is not None, "a worker event before the manager exists"
            manager.on_worker_exit(event)

        def on_start(event: WorkerStart) -> None:
            assert manager is not None, "a worker event before the manager exists"
            manager.on_worker_start(event)

        self.supervisor = Supervisor(self.runtime_dir, on_exit=on_exit, on_start=on_start, tracking=tracking)
        self.mps = None
        if opts.config.mps:
            self.mps = MpsControl(self.runtime_dir / "mps", opts.log_dir / "mps")
            try:
                self.mps.start()
            except MpsError as exc:
                raise StartupError(str(exc)) from None
        manager = Manager(keeper, self.supervisor, worker_paths)
        keeper.on_unwritable = self._tell_unwritable
        await self.supervisor.start()
        self.manager = manager
        try:
            report = await recover(manager)
        except (StateError, ManagerError) as exc:  # the state's disk failed: the workers are kept (see above)
            raise StartupError(f"cannot take over the previous run's workers: {exc}") from None
        await self.supervisor.end_unowned(
            keep={watcher_key(*ReplicaRef.parse(lost["replica"])) for lost in manager.state_loss})
        self.health = HealthMonitor(manager, Telemetry(self.gateway), opts.config.health)
        self.health.start()
        app = self.app = CgdApp(manager, self.health, opts.state_dir, machine_to_dict(machine),
                     extra_routes=deployment_routes(Deployments(manager)))
        keeper.instruments.registry.register(StateCollector(manager, self.health, __version__))
        self.server = listen(app, sock, opts.config.limits.connections_per_user)
        if metrics_sockets:
            self.metrics_server, app.metrics_listen = listen_metrics(app, metrics_sockets)
            log.info("serving /metrics on http://%s/metrics", app.metrics_listen)
        loop = asyncio.get_running_loop()
        self.tasks += [loop.create_task(self._watchdog()), loop.create_task(self._rotate_logs())]
        log.info(
            "cgd ready on %s: %s (%s), state %s generation %d; adopted %s, started %d",
            opts.socket, plural(len(machine.gpus), "GPU"), machine.source, opts.state_dir, keeper.doc.generation,
            plural(len(report.adopted), "worker"), len(report.started),
        )
        sdnotify.notify("READY=1")
        sdnotify.notify(f"STATUS=serving {len(machine.gpus)} GPUs on {opts.socket}")

    @staticmethod
    def _tell_unwritable(why: str) -> None:
        """systemd's status line says what every refused request says (see StateKeeper.on_unwritable)."""
        sdnotify.notify(f"STATUS=state not writable, every change refused until cgd restarts: {why}")

    async def _watchdog(self) -> None:
        """Ping systemd's watchdog twice per interval (every 10 s outside systemd, where it is a no-op)."""
        interval = sdnotify.watchdog_interval()
        period = min(interval / 2, 10.0) if interval else 10.0
        while True:
            sdnotify.notify("WATCHDOG=1")
            await asyncio.sleep(period)

    async def _rotate_logs(self) -> None:
        """Rotate worker logs every ROTATE_PERIOD_S: a chatty worker writes
        megabytes per second, so a longer period lets a log grow far past
        log_max_bytes. A scan is one open and fstat per log file."""
        config = self.opts.config
        while True:
            try:
                await asyncio.to_thread(rotate_all, self.opts.log_dir, config.log_max_bytes, config.log_backups)
            except OSError as exc:
                log.warning("log rotation failed: %s", exc)
            await asyncio.sleep(ROTATE_PERIOD_S)

    async def stop(self) -> None:
        assert self.manager is not None and self.health is not None and self.server is not None, "started"
        assert self.app is not None, "started"
        sdnotify.notify("STOPPING=1")
        log.info("stopping: %s workers", "keeping" if self.opts.keep_workers else "stopping")
        self.server.stop()
        if self.metrics_server is not None:
            self.metrics_server.stop()
        self.manager.keeper.events.close()
        self.manager.keeper.stop_waits()
        await self.app.answered(ANSWER_S)
        for task in self.tasks:
            task.cancel()
        await self.health.stop()
        await shutdown(self.manager, self.opts.keep_workers)
        self.manager.keeper.store.let_go()
        if self.mps is not None and not self.opts.keep_workers:
            self.mps.stop()
        try:
            self.opts.socket.unlink()
        except FileNotFoundError:
            pass
        self.gateway.close()
        self.instance.release()
        log.info("cgd stopped")
