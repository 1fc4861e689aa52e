"""One process, pinned by a pidfd: signals and exit notices reach exactly
that process, never a later one that got its pid.

The exit notice is the point of this module: a shadow is promoted when its
primary dies, within 100 ms of the death, so the death must be seen at once.
A pidfd becomes readable the moment the process exits, whether or not it is
our child (adopted workers are not), and the event loop wakes on it like on a
socket. Kernels without pidfd_open (before 5.3) fall back to a 20 ms poll.
"""

from __future__ import annotations

import asyncio
import errno
import os
import select
import signal
from collections.abc import Callable

import psutil

POLL_S = 0.02
SAME_START_S = 1.0
"""Start times are compared with this tolerance: psutil derives them from the
boot time, which moves by a second when the clock is stepped. A pid is not
reused within a second of its previous owner's start."""


def _pidfd_works() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


HAVE_PIDFD = _pidfd_works()


def start_time(pid: int, *, allow_zombie: bool = False) -> float | None:
    """psutil's create_time of `pid`, or None when it is gone (or a zombie,
    which is a dead process for everyone but its parent)."""
    try:
        proc = psutil.Process(pid)
        if not allow_zombie and proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return float(proc.create_time())
    except psutil.Error:
        return None


class ProcessHandle:
    def __init__(self, pid: int, create_time: float, pidfd: int | None, child: bool) -> None:
        self.pid = pid
        self.create_time = create_time
        self.child = child
        self._pidfd = pidfd
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poller: asyncio.TimerHandle | None = None

    @classmethod
    def open(cls, pid: int, create_time: float | None = None, *, child: bool = False) -> ProcessHandle | None:
        """A handle on `pid` if it lives and, when `create_time` is given,
        started then; else None. The start time is read after the pidfd is
        opened, so the pidfd is known to point at that very process."""
        pidfd = None
        if HAVE_PIDFD:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError:
                return None
        actual = start_time(pid, allow_zombie=child)
        if actual is None or (create_time is not None and abs(actual - create_time) > SAME_START_S):
            if pidfd is not None:
                os.close(pidfd)
            return None
        return cls(pid, actual, pidfd, child)

    def alive(self) -> bool:
        if self._pidfd is not None:
            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)
            return not poller.poll(0)
        if self.child:
            try:
                return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
            except ChildProcessError:
                return False
        actual = start_time(self.pid)
        return actual is not None and abs(actual - self.create_time) <= SAME_START_S

    def send(self, signum: int) -> bool:
        """Signal this process only; False if it is gone."""
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signum)
            elif self.alive():
                os.kill(self.pid, signum)
            else:
                return False
        except ProcessLookupError:
            return False
        return True

    def send_group(self, signum: int) -> bool:
        """Signal the process and its descendants: circus starts every worker
        in a session of its own, so its process group holds whatever it
        spawned (a shell's command, torchrun's ranks), which would otherwise
        keep GPU memory after the worker is gone. The leader is alive when
        we look, so its group id can not belong to anyone else."""
        if not self.alive():
            return False
        try:
            if os.getpgid(self.pid) == self.pid:
                os.killpg(self.pid, signum)
                return True
        except ProcessLookupError:
            return False
        return self.send(signum)

    def watch(self, loop: asyncio.AbstractEventLoop, on_exit: Callable[[], None]) -> None:
        """Call `on_exit` once, from `loop`, when the process exits."""
        self._loop = loop

        def fire() -> None:
            self.unwatch()
            on_exit()

        if self._pidfd is not None:
            loop.add_reader(self._pidfd, fire)
            return

        def poll() -> None:
            if self.alive():
                self._poller = loop.call_later(POLL_S, poll)
            else:
                fire()

        self._poller = loop.call_later(POLL_S, poll)

    def unwatch(self) -> None:
        if self._loop is not None and self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
        if self._poller is not None:
            self._poller.cancel()
            self._poller = None
        self._loop = None

    def reap(self) -> int | None:
        """Collect the exit status if we are the parent (negative: killed by
        that signal); None when it is not our child or still runs."""
        try:
            if self._pidfd is not None:
                result = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG)
            elif self.child:
                result = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG)
            else:
                return None
        except ChildProcessError:
            return None
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                return None
            raise
        if result is None:
            return None
        if result.si_code == os.CLD_EXITED:
            return result.si_status
        return -result.si_status

    def close(self) -> None:
        self.unwatch()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
