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

Nothing may act on a change before it is durable, and a follower acts on
what it reads: so an event of a commit is held back (numbered, kept and
streamed) until the commit's generation is on disk (`release`, called
from the fsync's completion). Counters still count it at commit
(`subscribe`). An event not tied to a commit that comes while some are
held waits behind them, so the stream stays in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pwd
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from computegroups.daemon.model.errors import BadRequest
from computegroups.statefiles.store import replace_file

EPOCH_SPAN = 1_000_000_000
"""Numbers one run may use: a billion events, then the next run's numbers would be reached."""

DEFAULT_KEEP = 10_000
EPOCH_FILE = "events.epoch"

Event = dict[str, Any]

log = logging.getLogger("cgd.events")


def next_epoch(state_dir: Path) -> int:
    """Count this run's epoch up from the last one and write it durably: once per start.

    A new state directory starts at epoch 1. Should the file be lost, numbers
    start again from 1: a client holding a larger one is told of the gap.
    """
    path = state_dir / EPOCH_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)  # a planted link reads as no file
        with os.fdopen(fd, "rb") as f:
            last = int(f.read(64).decode("ascii").strip())
    except (OSError, ValueError, UnicodeDecodeError):
        last = 0
    epoch = last + 1
    replace_file(path, f"{epoch}\n".encode("ascii"))  # as root, never through a planted link
    return epoch


class EventLog:
    """The ring of recent events, the events held until their commit is durable, and the
    waiters for the next one.

    `emit` is synchronous and cheap (a dict into a list or a deque, waiters
    woken), so the core calls it inside its decisions without awaiting anything.
    """

    def __init__(self, epoch: int = 0, keep: int = DEFAULT_KEEP,
                 clock: Callable[[], float] = time.time) -> None:
        self.epoch = epoch
        self.base = epoch * EPOCH_SPAN
        self.last_seq = self.base
        self.clock = clock
        self._ring: deque[Event] = deque(maxlen=keep)
        self._held: list[tuple[int, Event, bool]] = []
        """(generation, event, of_commit): the events of commits not yet durable, in commit order, and
        those not tied to a commit (`of_commit` False) that came meanwhile and wait behind them."""
        self._durable = -1
        """The last generation `release` was told is durable."""
        self._names: dict[int, str] = {}
        """Logins by uid: looked up off the event loop (`learn_names`) where the commit's fsync runs."""
        self._unknown: deque[int] = deque()
        """Uids of held events whose login is not known yet (a deque: `learn_names` pops from a thread)."""
        self._waiters: list[asyncio.Future[None]] = []
        self._subscribers: list[Callable[[Event], None]] = []
        self.closed = False
        """Set when cgd stops: followers end their streams."""

    def subscribe(self, callback: Callable[[Event], None]) -> None:
        """Call `callback` with every event from now on, as it is emitted (the metrics count them).

        The event has no `seq` yet when it is held for its commit's fsync."""
        self._subscribers.append(callback)

    def emit(self, type_: str, message: str, *, uid: int | None = None, generation: int | None = None,
             **what: Any) -> Event:
        """Record one event: `uid` is whose it is (None: the machine's, seen by everyone); `generation`
        the commit it tells of, held back from followers until `release` says it is durable."""
        event: Event = {"seq": None, "time": self.clock(), "type": type_, "uid": uid, "user": None,
                        **what, "message": message}
        for callback in self._subscribers:
            try:
                callback(event)
            except Exception:  # a subscriber's fault must not undo or hide what happened
                log.exception("an event subscriber failed on %s", type_)
        if generation is not None and generation > self._durable:
            self._held.append((generation, event, True))
        elif self._held:
            self._held.append((self._held[-1][0], event, False))
        else:
            self._publish(event)
            self.wake()
            return event
        if uid is not None and uid not in self._names:
            self._unknown.append(uid)
        return event

    def release(self, durable: int) -> None:
        """Publish the held events of every generation up to `durable`, now on disk."""
        self._durable = max(self._durable, durable)
        n = 0
        while n < len(self._held) and self._held[n][0] <= self._durable:
            self._publish(self._held[n][1])
            n += 1
        if n:
            del self._held[:n]
            self.wake()

    def drop_held(self) -> int:
        """Never tell the held events of commits: an fsync failed, and their commits may not be on disk.
        Those not tied to a commit (a worker's exit) are told now. Returns how many were dropped."""
        held, self._held = self._held, []
        for _, event, of_commit in held:
            if not of_commit:
                self._publish(event)
        self.wake()
        return sum(1 for _, _, of_commit in held if of_commit)

    def learn_names(self) -> None:
        """Look up the logins of held events' owners: blocking (NSS may ask a directory server),
        so it runs in a worker thread, beside the fsync that holds those events back."""
        while self._unknown:
            try:
                uid = self._unknown.popleft()
            except IndexError:
                return
            if uid not in self._names:
                self._names[uid] = _lookup(uid)

    def _publish(self, event: Event) -> None:
        self.last_seq += 1
        event["seq"] = self.last_seq
        uid = event["uid"]
        if uid is not None:
            name = self._names.get(uid)
            if name is None:  # not looked up off the loop (an event no commit held): once per uid
                name = self._names[uid] = _lookup(uid)
            event["user"] = name
        self._ring.append(event)

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
        if seq is not None and seq >= self.last_seq:
            return [], gap
        if seq is not None and seq >= first:
            # Numbers within a run have no holes: the newest `last_seq - seq` are the ones after `seq`,
            # taken from the right, so a follower that keeps up costs what it reads, not the ring's size.
            newest = list(itertools.islice(reversed(self._ring), self.last_seq - seq))
            return [e for e in reversed(newest) if visible(e)], gap
        return [e for e in self._ring if visible(e)], gap

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


def _lookup(uid: int) -> str:
    """A login for the event's reader; the uid as text when it has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def visible_to(uid: int, is_root: bool) -> Callable[[Event], bool]:
    """Who sees what: root everything, a user the events of their own components and the machine's."""
    if is_root:
        return lambda e: True
    return lambda e: e["uid"] is None or e["uid"] == uid
