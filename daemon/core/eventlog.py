"""What happened, in order: the bus every event of cgd goes through.

The core emits here where it decides (a commit's changes, a worker's exit,
a GPU's fault); the API only streams what is kept (`GET /v1/events`), and
the metrics count what passes (`subscribe`). Events are kept in a bounded
ring, so a client that reconnects with the last sequence number it saw
misses nothing still kept, and is told (a `gap` event) when it missed more.

Sequence numbers survive a restart without a write per event: each run of
cgd has an epoch, counted up and written once at start
(`events.epoch` in the state directory), and its numbers are
`epoch * EPOCH_SPAN + n`, n counting from 1. So they only grow across
restarts, and a client holding a number of an earlier run learns from the
`gap` event that the rest of that run is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import pwd
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from computegroups.daemon.model.errors import BadRequest

EPOCH_SPAN = 1_000_000_000
"""Numbers one run may use: a billion events, then the next run's numbers would be reached."""

DEFAULT_KEEP = 10_000
EPOCH_FILE = "events.epoch"

Event = dict[str, Any]


def next_epoch(state_dir: Path) -> int:
    """Count this run's epoch up from the last one and write it durably: once per start.

    A new state directory starts at epoch 1. Should the file be lost, numbers
    start again from 1: a client holding a larger one is told of the gap.
    """
    path = state_dir / EPOCH_FILE
    try:
        last = int(path.read_text(encoding="ascii").strip())
    except (FileNotFoundError, ValueError):
        last = 0
    epoch = last + 1
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="ascii") as f:
        f.write(f"{epoch}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(state_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return epoch


class EventLog:
    """The ring of recent events and the waiters for the next one.

    `emit` is synchronous and cheap (a dict into a deque, waiters woken), so
    the core calls it inside its decisions without awaiting anything.
    """

    def __init__(self, epoch: int = 0, keep: int = DEFAULT_KEEP,
                 clock: Callable[[], float] = time.time) -> None:
        self.epoch = epoch
        self.base = epoch * EPOCH_SPAN
        self.last_seq = self.base
        self.clock = clock
        self._ring: deque[Event] = deque(maxlen=keep)
        self._waiters: list[asyncio.Future[None]] = []
        self._subscribers: list[Callable[[Event], None]] = []
        self.closed = False
        """Set when cgd stops: followers end their streams."""

    def subscribe(self, callback: Callable[[Event], None]) -> None:
        """Call `callback` with every event from now on (the metrics count them)."""
        self._subscribers.append(callback)

    def emit(self, type_: str, message: str, *, uid: int | None = None, **what: Any) -> Event:
        """Record one event: `uid` is whose it is (None: the machine's, seen by everyone)."""
        self.last_seq += 1
        event: Event = {"seq": self.last_seq, "time": self.clock(), "type": type_, "uid": uid,
                        "user": _user(uid), **what, "message": message}
        self._ring.append(event)
        for callback in self._subscribers:
            callback(event)
        self.wake()
        return event

    def wake(self) -> None:
        """Wake every waiter, to look again (a new event, a follower gone, cgd stopping)."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def close(self) -> None:
        self.closed = True
        self.wake()

    def first_kept(self) -> int:
        """The number of the oldest event kept (last_seq + 1 when none is)."""
        return self._ring[0]["seq"] if self._ring else self.last_seq + 1

    def check_since(self, seq: int | None) -> None:
        """Refuse a `since` no run of cgd can have given: one of this run not told yet, or one
        below every run's numbers (0 means "from the start", as no `since` does)."""
        if seq is None or seq == 0:
            return
        if seq < EPOCH_SPAN:
            raise BadRequest(f"since: {seq} is no event number of cgd: they are epoch * {EPOCH_SPAN} + n, "
                             f"this run's from {self.base + 1}")
        if seq // EPOCH_SPAN == self.epoch and seq > self.last_seq:
            raise BadRequest(f"since: {seq} is after the last event of this run ({self.last_seq})")

    def after(self, seq: int | None, visible: Callable[[Event], bool]) -> tuple[list[Event], Event | None]:
        """The kept events after `seq` that `visible` lets through, and a `gap` event first when
        some after `seq` are no longer kept (None or 0 for `seq`: everything kept, no gap).

        `seq` passed `check_since`; one of a later epoch than this run's means the numbers
        started again (the epoch file was lost with the state directory): all that is kept follows.
        """
        gap = None
        first = self.first_kept()
        seq = given = seq or None
        if seq is not None and seq // EPOCH_SPAN > self.epoch:
            reason, seq = "cgd's numbers started again (its state directory was replaced)", self.base
        elif seq is not None and seq < self.base:
            reason = "cgd restarted since: the events of its earlier run are gone"
        elif seq is not None and seq < first - 1:
            reason = f"older events are no longer kept (the last {self._ring.maxlen})"
        else:
            reason = None
        if reason is not None:
            gap = {"seq": None, "time": self.clock(), "type": "gap", "uid": None, "user": None,
                   "after": given, "next": first, "message": f"missed events: {reason}"}
        if seq is None or seq < first:
            skip = 0
        elif seq >= self.last_seq:
            return [], gap
        else:
            skip = seq - first + 1  # numbers within a run have no holes: the ring is indexed by them
        return [e for e in itertools.islice(self._ring, skip, None) if visible(e)], gap

    async def wait(self, seq: int, timeout: float) -> None:
        """Return once an event after `seq` is emitted, or after `timeout` seconds."""
        if self.last_seq > seq:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)


@functools.lru_cache(maxsize=256)
def _user(uid: int | None) -> str | None:
    """A login for the event's reader; the uid as text when it has none."""
    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def visible_to(uid: int, is_root: bool) -> Callable[[Event], bool]:
    """Who sees what: root everything, a user the events of their own components and the machine's."""
    if is_root:
        return lambda e: True
    return lambda e: e["uid"] is None or e["uid"] == uid
