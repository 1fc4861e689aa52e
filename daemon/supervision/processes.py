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


def group_members(pgid: int) -> list[int]:
    """The processes of group `pgid` that are not zombies: a zombie holds
    no memory (GPU memory included), and an orphaned one is reaped only when
    init gets to it, which in a container may be never.

    A group id is its first leader's pid, and the kernel does not hand that
    pid out again while any process, zombie or not, is in the group; pids
    are handed out in a cycle besides. So a group found here is the one that
    leader made, unless it empties and a new process gets that pid and makes
    a group of it before the caller acts on the answer."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    return [pid for pid in _all_pids() if _running_in_group(pid, pgid)]


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name in parentheses
    (which may hold anything): the state, the parent pid, the group id, ...,
    the start time in clock ticks since boot at index 19. None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2:].split()


def _running_in_group(pid: int, pgid: int) -> bool:
    fields = stat_fields(pid)
    return fields is not None and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X")


def _leads_group(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


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
    """`group` is the process group the process led when the handle was
    opened (circus starts every worker in a session of its own), None if it
    led none: kept so that what is left of the group can still be reached
    once the leader is gone.

    A launch shim (launch.py) does not lead the group that matters: its
    worker leads one of its own. `find_group` names it once it exists
    (None until then: what is sent to the group goes to the shim, which
    passes it on)."""

    def __init__(self, pid: int, create_time: float, pidfd: int | None, child: bool,
                 group: int | None = None, find_group: Callable[[], int | None] | None = None) -> None:
        self.pid = pid
        self.create_time = create_time
        self.child = child
        self._group = group
        self._find_group = find_group
        self._pidfd = pidfd
        self._loop: asyncio.AbstractEventLoop | None = None
        self._poller: asyncio.TimerHandle | None = None

    @property
    def group(self) -> int | None:
        if self._find_group is not None:
            found = self._find_group()
            if found is not None:
                self._group, self._find_group = found, None
        return self._group

    @classmethod
    def open(cls, pid: int, create_time: float | None = None, *, child: bool = False,
             find_group: Callable[[], int | None] | None = None) -> ProcessHandle | None:
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
        if find_group is not None:
            return cls(pid, actual, pidfd, child, None, find_group)
        return cls(pid, actual, pidfd, child, pid if _leads_group(pid) else None)

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
        """Signal the process and its descendants: its process group holds
        whatever it spawned (a shell's command, torchrun's ranks), which
        would otherwise keep GPU memory after the worker is gone. The group
        is signalled while the leader lives (its pid, the group id, can then
        belong to no one else) or, once it is gone, while the group still
        has members (see `group_members`). False if nothing was signalled."""
        group = self.group
        if group is None:
            return self.send(signum)
        if not self.alive() and not group_members(group):
            return False
        try:
            os.killpg(group, signum)
        except ProcessLookupError:
            return self.send(signum)
        return True

    def group_left(self) -> list[int]:
        """The pids still running of the process and of the group it led:
        it has stopped only once this is empty."""
        group = self.group
        if group is None:
            return [self.pid] if self.alive() else []
        return group_members(group)

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
