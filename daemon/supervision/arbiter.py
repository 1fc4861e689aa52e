"""circus's Arbiter, run on cgd's own event loop and kept private.

What is changed from a stock circusd, and why:

- The arbiter runs on the loop that is already running in the main thread
  (circus's ThreadedArbiter is broken on current Python, and one loop means
  no locking between cgd and circus).
- check_delay is 0: circus's periodic `manage_watchers` would reap with
  `waitpid(-1)`, stealing the exit status of every other child of cgd, and
  notices deaths only once a second. The supervisor watches each process
  through a pidfd instead and decides restarts itself.
- The controller does not install circus's SIGTERM/SIGINT/SIGQUIT/SIGHUP
  handlers: cgd owns its signals (SIGTERM with --keep-workers must not stop
  every worker, which circus's handler would).
- Both ZMQ endpoints are ipc sockets in a 0700 directory owned by cgd: the
  endpoint has no authentication, so only cgd's user may reach it.
- Its own ZMQ context, destroyed on close, so nothing lingers in the process.
- Processes start without circus's preexec_fn (see `_Process`): a worker's
  start is not held up by a copy of cgd's address space.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq
from circus.arbiter import Arbiter
from circus.controller import Controller
from circus.exc import AlreadyExist
from circus.process import Process
from circus.util import synchronized
from circus.watcher import Watcher
from psutil import Popen
from tornado.ioloop import IOLoop

log = logging.getLogger(__name__)

PRIVATE_DIR = "circus"
_IPC_PATH_MAX = 100
"""sockaddr_un holds 108 bytes; keep a margin for the socket names."""


class _NoSignals:
    def stop(self) -> None:
        return None


class _Controller(Controller):
    def _init_syshandler(self) -> None:
        self.sys_hdl = _NoSignals()


class _Process(Process):
    """circus's Process, started without a preexec_fn.

    circus starts every process through a Python preexec_fn (setsid, stdin
    from /dev/null), and with one subprocess must fork() a copy of cgd's
    whole address space and wait while the copy runs Python: about 3 ms per
    start at cgd's size. subprocess does those two things itself
    (`start_new_session`, `stdin=DEVNULL`) after a vfork, in a tenth of
    that. The rest of circus's preexec_fn (uid, gid, rlimits, a stdin
    socket) is never asked for by cgd: the launch shim drops privileges.
    """

    def spawn(self) -> None:
        self.started = time.time()
        self._worker = Popen(self.format_args(), cwd=self.working_dir, env=self.env, close_fds=True,
                             executable=self.executable, start_new_session=True, stdin=subprocess.DEVNULL)


class _Watcher(Watcher):
    @property
    def _process_class(self) -> type[Process]:
        return _Process


class _Arbiter(Arbiter):
    def _init_context(self, context: zmq.Context[zmq.Socket[bytes]]) -> None:
        self.context = context
        self._ensure_ioloop()
        self.ctrl = _Controller(self.endpoint, self.multicast_endpoint, self.context, self.loop,
                                self, self.check_delay, self.endpoint_owner)

    @synchronized("arbiter_add_watcher")
    def add_watcher(self, name: str, cmd: str, **kw: Any) -> Watcher:
        """circus's own, with our watcher class (circus names its class in the body)."""
        if name.lower() in self._watchers_names:
            raise AlreadyExist(f"{name!r} already exist")
        watcher = _Watcher(name, cmd, **kw)
        if self.evpub_socket is not None:
            watcher.initialize(self.evpub_socket, self.sockets, self)
        self.watchers.append(watcher)
        self._watchers_names[watcher.name.lower()] = watcher
        watcher.notify_event("add", {"time": time.time()})
        return watcher


def private_dir(runtime_dir: Path) -> tuple[Path, bool]:
    """`<runtime_dir>/circus`, mode 0700, refusing anything cgd does not own.

    ipc paths are limited to ~100 bytes; under a longer runtime directory a
    fresh 0700 directory in the temp dir is used (the second value says it
    is temporary, to be removed on close).
    """
    path = runtime_dir / PRIVATE_DIR
    if len(str(path / "control.sock").encode()) > _IPC_PATH_MAX:
        return Path(tempfile.mkdtemp(prefix="cg-circus-")), True
    runtime_dir.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise PermissionError(f"{path} is not a directory owned by uid {os.geteuid()}")
    os.chmod(path, 0o700)
    return path, False


class LoopArbiter:
    """The arbiter and the directory of its endpoints and launch specs."""

    def __init__(self, runtime_dir: Path) -> None:
        self.directory, self._temporary = private_dir(runtime_dir)
        self.spec_dir = self.directory / "specs"
        self.spec_dir.mkdir(mode=0o700, exist_ok=True)
        self._context = zmq.Context()
        self._arbiter = _Arbiter(
            [], f"ipc://{self.directory}/control.sock", f"ipc://{self.directory}/events.sock",
            check_delay=0, context=self._context, loop=IOLoop.current(), proc_name="cgd",
        )

    async def start(self) -> None:
        await self._arbiter.start()

    def add(self, name: str, argv: list[str], stop_signal: int, stop_timeout_s: float) -> Watcher:
        """A one-process watcher that circus never respawns by itself. The
        command starts with an empty environment and in '/': the launch shim
        sets both for the worker."""
        options: dict[str, Any] = dict(
            args=argv[1:], env={}, working_dir="/", numprocesses=1, singleton=True,
            respawn=False, max_retry=1, stop_signal=stop_signal, graceful_timeout=stop_timeout_s,
            copy_env=False, use_sockets=False, close_child_stdin=True,
        )
        return self._arbiter.add_watcher(name, shlex.quote(argv[0]), **options)

    async def spawn(self, watcher: Watcher) -> Process | None:
        """Start the watcher's process; None if circus could not fork it.

        `_start` is the unsynchronized coroutine circus's own commands call:
        the synchronized `start` takes circus's global command lock and
        refuses (ConflictError) while another command runs.
        """
        await watcher._start()
        processes = list(watcher.processes.values())
        return processes[0] if processes else None

    def remove(self, name: str) -> None:
        """Forget the watcher without touching its process (already gone or
        handed over); with nostop the removal completes at once."""
        try:
            self._arbiter.rm_watcher(name, nostop=True)
        except KeyError:
            pass

    def close(self) -> None:
        if self._arbiter.running:
            self._arbiter.stop_controller_and_close_sockets()
        self._context.destroy(linger=0)
        for name in ("control.sock", "events.sock"):
            try:
                os.unlink(self.directory / name)
            except FileNotFoundError:
                pass
        if self._temporary:
            shutil.rmtree(self.directory, ignore_errors=True)
