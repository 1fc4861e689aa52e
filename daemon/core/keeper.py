"""The state document, its commits and the allocator's view of it: the one keeper of the state.

A transaction here is taken, decided in (see transactions.py for the
decisions), appended and made durable by group commit; its events are told
once it is durable, and the allocator's ledger follows every commit. The
record helpers of transactions.py build on this; nothing here knows them.
"""

from __future__ import annotations

import asyncio
import copy
import errno
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from computegroups.daemon.core.changes import WorkerPid, state_changes, touched
from computegroups.daemon.core.consistency import check_consistent
from computegroups.daemon.core.eventlog import EventLog
from computegroups.daemon.core.instruments import Instruments
from computegroups.daemon.core.views import capacity_refusal
from computegroups.daemon.model.claims import Claim
from computegroups.daemon.model.config import DaemonConfig
from computegroups.daemon.model.enums import GroupState
from computegroups.daemon.model.errors import (
    Conflict,
    InsufficientCapacity,
    InsufficientStorage,
    ManagerError,
    StateUnwritable,
    Stopping,
    Unsatisfiable,
)
from computegroups.daemon.model.refs import component_of
from computegroups.daemon.placement import choices
from computegroups.daemon.placement.allocator import Allocator, DoesNotFitNow, Holding, NeverFits, Placement
from computegroups.statefiles.errors import StateError, StateLockedError
from computegroups.statefiles.journal import Tracked
from computegroups.statefiles.schema import (
    DeviceRecord,
    GroupRecord,
    StateDoc,
)
from computegroups.statefiles.store import StateStore, Transaction
from computegroups.topology.model import Machine

log = logging.getLogger("cgd.manager")

STOPPING = "cgd is stopping; ask again once it is back (a restart keeps the queue and the jobs)"


class StateKeeper:
    """The state document, and the allocator's view of it that never goes stale.

    The document read under the lock is the one truth. The allocator's ledger
    is derived from it: brought in line before every placement and at every
    commit (`Allocator.follow` touches only the groups that differ), and
    rebuilt when the lock is taken if the document's generation is not the
    one the ledger followed (another process committed, or a commit failed).
    If anything raises inside `transaction()`, nothing is written and the
    ledger follows the last committed document again.

    Commits are group commits: a transaction appends its change and lets
    the lock go before the change is durable, so requests that arrive while
    an fsync is in flight share the next one. Nothing may act on a change
    (start or stop a process, answer a client) before `durable()` says it
    is on disk; the manager's process steps and the API's replies wait for it,
    and a commit's events reach followers only when its fsync has ended
    (`EventLog.release`).
    """

    def __init__(self, machine: Machine, store: StateStore, config: DaemonConfig,
                 clock: Callable[[], float] = time.time, events: EventLog | None = None,
                 instruments: Instruments | None = None) -> None:
        self.machine = machine
        self.store = store
        self.config = config
        self.clock = clock
        self.lock = asyncio.Lock()
        self.doc: StateDoc = store.load()
        check_consistent(self.doc, machine)
        self.unhealthy: set[int] = set()
        self.lost_holders: dict[int, tuple[str, ...]] = {}
        """Per GPU that workers of a lost generation of the state still run on (see lost.py), who
        they are (`lost/0 of alice`)."""
        self.foreign: dict[int, int] = {}
        self.events = events if events is not None else EventLog()
        """Where the events of every commit go (see changes.py); the manager adds its own."""
        self.instruments = instruments if instruments is not None else Instruments(hostname=machine.hostname)
        self.events.subscribe(self.instruments.count)
        self._gpu_index = {g.uuid: g.index for g in machine.gpus}
        self.worker_pid: WorkerPid = lambda component, replica, shim: None
        """The worker's own pid behind launch shim `shim`, for the events (the state records the
        shim's): supervision knows it, and the manager installs this when it is set up."""
        self.path_owner: Callable[[StateDoc, str], str | None] = lambda doc, name: None
        """The deployment whose plan names `name` (a set, scaling group or component path), if any.

        Plans are the deployments layer's business: it installs this when it
        is set up, so the core never reads a deployment file."""
        self.allocator = Allocator(machine, config.allocator)
        self._present = frozenset(g.uuid for g in machine.gpus)
        self._basis: dict[str, GroupRecord] = {}
        """A copy of each group record as the ledger last followed it: only groups
        that differ from it (a cheap comparison of Structs) are derived again."""
        self._followed = -1
        """The generation of the document the ledger was last brought in line with."""
        self._txn_groups: dict[str, GroupRecord] | None = None
        """The open transaction's group map. The store hands out maps that remember the keys set
        or removed in them (`Tracked`): those, and the groups placed meanwhile, are all that can
        differ from what the ledger followed when the transaction began."""
        self._txn_generation = -1
        self._placed: set[str] = set()
        self.claims_placed = 0
        """Claims the open (or last) transaction placed: counted as granted if it commits. Attaching to groups
        held already (a shadow, a sharer, a reservation taken) places nothing, nor does a restore."""
        self._draining: dict[str, frozenset[int]] = {}
        """The GPUs of each draining group, kept beside the ledger: nothing new goes there."""
        self._syncing: asyncio.Future[None] | None = None
        """The fsync in flight, which every change appended before it began shares."""
        self._flusher: asyncio.Task[None] | None = None
        self._watchers: list[asyncio.Future[None]] = []
        """Waiters for the next commit (`changed`)."""
        self.stopping = False
        """Set by `stop_waits` when cgd stops: every wait for a commit ends with `Stopping`."""
        self.on_unwritable: Callable[[str], None] = lambda why: None
        """Called once when the store starts refusing every change (a failed fsync), with its reason:
        cgd tells systemd (the daemon layer installs it)."""
        self._unwritable_told = False
        self.on_freed: Callable[[], None] = lambda: None
        """Called after a commit that gave capacity back (a group gone, a GPU undrained): the queue's cue."""
        self._freed = False
        self._unavailable: set[int] = set()
        self._follow(self.doc)

    def _follow(self, doc: StateDoc, keys: Iterable[str] | None = None) -> None:
        """Bring the ledger in line with `doc`, looking at `keys` alone when only they can differ.

        Inside a transaction that is what it touched, so a decision on a
        large state costs what the transaction changed, not the state's size.
        """
        groups, basis, held = doc.groups, self._basis, self.allocator.held_ids()
        if keys is None and groups is self._txn_groups and isinstance(groups, Tracked):
            keys = groups.touched | self._placed
        if keys is None:
            keys = basis.keys() | held | groups.keys()
            if groups is not self._txn_groups:  # a document put in whole: its changes are not all touched keys
                self._txn_groups = None
        changes: dict[str, Holding | None] = {}
        for gid in keys:
            g, was = groups.get(gid), basis.get(gid)
            if g is None:
                if was is not None or gid in held:  # gone from the document, or placed and never recorded
                    changes[gid] = None
                    self._freed = self._freed or was is not None
                    basis.pop(gid, None)
                    self._draining.pop(gid, None)
            elif was is not g and was != g:  # records are frozen: most are the very objects followed before
                changes[gid] = self._holding(g)
                basis[gid] = g
                if g.state == GroupState.DRAINING:
                    self._draining[gid] = frozenset(d.gpu_index for d in g.devices)
                else:
                    self._draining.pop(gid, None)
        self.allocator.update(changes)
        self._hold_out(doc)
        self.allocator.set_foreign(self.foreign)
        self._followed = doc.generation

    def _hold_out(self, doc: StateDoc) -> None:
        """The one path by which the allocator learns which GPUs take nothing new: a GPU that
        leaves the set is capacity given back (`on_freed`), counted once, whoever changed it."""
        unavailable = self.unavailable_gpus(doc)
        self._freed = self._freed or bool(self._unavailable - unavailable)
        self._unavailable = unavailable
        self.allocator.set_unavailable(unavailable)

    def hold_out(self, *, unhealthy: set[int] | None = None,
                 lost_holders: dict[int, tuple[str, ...]] | None = None) -> None:
        """Change the GPUs held out for their health or for a lost generation's workers (facts
        of the machine, not of the state), under the lock; the queue is told at once when
        a GPU came back."""
        if unhealthy is not None:
            self.unhealthy = unhealthy
        if lost_holders is not None:
            self.lost_holders = lost_holders
        self._hold_out(self.doc)
        if self._freed:
            self._freed = False
            self.on_freed()

    def _roll_back(self) -> None:
        """After a failed transaction, follow the last committed document again.

        When the transaction began from that very document, only what it
        touched can differ; otherwise (another writer committed meanwhile)
        every group is looked at.
        """
        groups, self._txn_groups = self._txn_groups, None
        if isinstance(groups, Tracked) and self._txn_generation == self.doc.generation:
            self._follow(self.doc, groups.touched | self._placed)
        else:
            self._follow(self.doc)

    def sync_ledger(self, doc: StateDoc) -> None:
        """Bring the allocator's ledger in line with `doc` (the open transaction's) before asking it anything."""
        self._follow(doc)

    async def changed(self, timeout: float) -> None:
        """Return at the next commit, or after `timeout` seconds: for those who wait for a state to be reached.

        Raises `Stopping` once cgd stops (`stop_waits`): the waiter's client asks the next cgd again."""
        if self.stopping:
            raise Stopping(STOPPING)
        waiter = asyncio.get_running_loop().create_future()
        self._watchers.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            if waiter in self._watchers:
                self._watchers.remove(waiter)
        if self.stopping:
            raise Stopping(STOPPING)

    def stop_waits(self) -> None:
        """cgd is stopping: end every wait for a commit now, and every later one at once, so a long
        poll is answered `Stopping` while cgd can still answer, not cut off when its loop ends."""
        self.stopping = True
        watchers, self._watchers = self._watchers, []
        for waiter in watchers:
            if not waiter.done():
                waiter.set_result(None)

    def _holding(self, g: GroupRecord) -> Holding | None:
        """What a group holds of the machine; None when it holds nothing here (lost, or its GPU is gone)."""
        if g.state == GroupState.LOST or any(d.gpu_uuid not in self._present for d in g.devices):
            return None
        return Holding(
            group_id=g.id,
            devices=tuple(device_share(d) for d in g.devices),
            owner=g.owner,
            users=frozenset(component_of(u) for u in g.users),
            exclusive_domain=frozenset(g.exclusive_domain) if g.exclusive_domain else None,
            priority=g.priority,
            reserved=g.state == GroupState.RESERVED,
            cpus=g.claim.cpus or 0,
        )

    def unavailable_gpus(self, doc: StateDoc) -> set[int]:
        """Drained, draining, unhealthy GPUs and those a lost generation's workers hold, for `doc`
        once the ledger follows it."""
        by_uuid = {g.uuid: g.index for g in self.machine.gpus}
        drained = {by_uuid[u] for u in doc.drained if u in by_uuid}
        return drained.union(*self._draining.values()) | self.unhealthy | set(self.lost_holders)

    def unavailable_reasons(self, doc: StateDoc) -> dict[int, str]:
        """Why each unavailable GPU is, in a refusal's words (the allocator only knows that it is)."""
        by_uuid = {g.uuid: g.index for g in self.machine.gpus}
        why: dict[int, list[str]] = {}
        for u in doc.drained:
            if u in by_uuid:
                why.setdefault(by_uuid[u], []).append("drained")
        for gid, gpus in sorted(self._draining.items()):
            for gpu in gpus:
                why.setdefault(gpu, []).append(f"group {gid} draining")
        for gpu in self.unhealthy:
            why.setdefault(gpu, []).append("unhealthy")
        for gpu, holders in self.lost_holders.items():
            why.setdefault(gpu, []).append(
                f"held by {', '.join(holders)}, kept from a lost generation of the state")
        return {gpu: " and ".join(parts) for gpu, parts in why.items()}

    @contextmanager
    def transaction(self) -> Iterator[StateDoc]:
        with self._open() as txn:
            yield txn.doc

    async def durable(self) -> None:
        """Return once every change committed so far is on disk, sharing one fsync with everyone waiting.

        One fsync runs at a time, in a thread so the loop keeps taking
        requests (whose changes the next fsync covers); a waiter whose change
        the running fsync does not cover waits for it, then starts the next.
        A failed fsync leaves the store refusing every change until cgd
        restarts and reads the disk again: what was acknowledged is known,
        what was not is lost, nothing in between.
        """
        target = self.doc.generation
        while self.store.durable_generation < target:
            syncing = self._syncing
            if syncing is None or syncing.done():  # a done one did not cover `target`: its callback may not have run
                syncing = self._syncing = asyncio.ensure_future(
                    asyncio.to_thread(self._timed_sync, self.doc.generation))
                syncing.add_done_callback(self._synced)
            try:
                await asyncio.shield(syncing)
            except StateError as exc:
                self._tell_unwritable()
                raise StateUnwritable(str(exc)) from exc
        self.events.release(self.store.durable_generation)  # before the caller answers or acts

    def _timed_sync(self, generation: int) -> None:
        started = time.perf_counter()
        self.store.sync(generation)
        self.instruments.state_sync_seconds.observe(time.perf_counter() - started)
        self.events.learn_names()  # off the loop, while the events wait for this fsync anyway

    def _synced(self, done: asyncio.Future[None]) -> None:
        """On the loop when an fsync ends: the events of what it made durable go out now."""
        if self._syncing is done:
            self._syncing = None
        self.events.release(self.store.durable_generation)

    @property
    def refusal(self) -> str | None:
        """Why every change is refused until cgd restarts (a failed fsync), or None: what health says."""
        return self.store.refusal

    def _tell_unwritable(self) -> None:
        """Once the store refuses every change, say so once to those who follow the events and to
        `on_unwritable`. The events held for commits not yet durable are dropped, never sent: those
        commits may not be on disk. The notice itself is published at once, so no follower is left
        waiting behind events that will never come."""
        why = self.refusal
        if why is None or self._unwritable_told:
            return
        self._unwritable_told = True
        log.critical("%s", why)
        dropped = self.events.drop_held()
        self.events.emit("state_unwritable", f"cgd cannot make its state durable and refuses every change "
                         f"until it restarts ({dropped} events of changes that may not be on disk dropped): "
                         f"{why}", reason=why, dropped=dropped)
        try:
            self.on_unwritable(why)
        except Exception:
            log.exception("telling that the state is unwritable failed")

    def _flush_soon(self) -> None:
        """Start the fsync of a change now, whether or not anyone waits for it.

        So a change nobody answers for (a worker's exit, recorded) is not left
        in the page cache until the next request. Without a running loop (a
        tool or a test using the keeper directly) the change is made durable
        before `transaction()` returns, as a plain store commit is.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            try:
                self.store.sync(self.doc.generation)
            except StateError as exc:
                self._tell_unwritable()
                raise (storage_refusal(exc) or exc) from exc
            self.events.release(self.store.durable_generation)
            return
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush())

    async def _flush(self) -> None:
        try:
            while self.store.durable_generation < self.doc.generation:
                await self.durable()
        except StateUnwritable:
            pass  # logged by durable(); every waiter gets the refusal itself

    @contextmanager
    def _open(self) -> Iterator[Transaction]:
        before = self.doc
        try:
            with (txn := self.store.transaction(sync=False)) as doc:
                if doc.generation != self._followed:
                    self._follow(doc)
                self._txn_groups, self._txn_generation, self._placed = doc.groups, doc.generation, set()
                self.claims_placed = 0
                yield txn
                self._follow(txn.doc)
                changed = txn.doc
                started = time.perf_counter()
            self.instruments.state_commit_seconds.observe(time.perf_counter() - started)
            self._txn_groups = None
            assert txn.committed is not None
            self.doc = txn.committed
            self._followed = self.doc.generation
        except StateLockedError:
            self._roll_back()
            raise
        except StateError as exc:
            self._roll_back()
            self._tell_unwritable()
            refusal = storage_refusal(exc)
            if refusal is None:
                raise
            raise refusal from exc
        except BaseException:
            self._roll_back()
            raise
        # Committed: from here on nothing may make the change look failed.
        if txn.written:
            self._flush_soon()
            self.instruments.granted(self.claims_placed)
            self._tell(before, changed)
            if self._freed:
                self._freed = False
                self.on_freed()
            watchers, self._watchers = self._watchers, []
            for waiter in watchers:
                if not waiter.done():
                    waiter.set_result(None)

    def _tell(self, before: StateDoc, changed: StateDoc) -> None:
        """The events of the commit just made (`changed`: the transaction's document, whose
        maps remember the keys it touched), held back from followers until it is durable.

        A fault in telling is logged, never raised: the change is made, and the
        caller must be told so."""
        after = self.doc
        try:
            for c in state_changes(before, after, touched(before.components, changed.components),
                                   touched(before.workers, changed.workers), touched(before.groups, changed.groups),
                                   self._gpu_index, self.worker_pid,
                                   touched(before.reservations, changed.reservations), self.clock()):
                self.events.emit(c.type, c.message, uid=c.uid, generation=after.generation, **c.what)
        except Exception:
            log.exception("telling the events of generation %d failed", after.generation)
        self.events.release(self.store.durable_generation)

    def restore(self, earlier: StateDoc) -> None:
        """Commit `earlier`'s content again, under a new generation."""
        with self._open() as txn:
            txn.doc = copy.deepcopy(earlier)

    def place(self, doc: StateDoc, claim: Claim, group_ids: list[str], owner: str, *,
              reserved: bool = False) -> tuple[Placement, ...]:
        """The allocator's answer against `doc` as it stands in the open transaction.

        The ledger follows `doc` first, so what this transaction already
        changed (a group just placed and its users, a reservation taken, a
        group freed) counts for this decision.
        """
        self._follow(doc)
        self._placed.update(group_ids)
        started = time.perf_counter()
        try:
            placements = choices.place(self.allocator, claim, group_ids, owner, reserved=reserved)
            self.claims_placed += 1
            return placements
        except NeverFits as exc:
            raise Unsatisfiable(str(exc)) from None
        except DoesNotFitNow as exc:
            raise InsufficientCapacity(capacity_refusal(doc, exc, self.unavailable_reasons(doc))) from None
        except ValueError as exc:
            raise Conflict(str(exc)) from None
        finally:
            self.instruments.decision_seconds.observe(time.perf_counter() - started)


def device_share(d: DeviceRecord):
    from computegroups.daemon.placement.allocator import DeviceShare

    return DeviceShare(gpu=d.gpu_index, mig_uuid=d.mig_uuid, memory_mib=d.memory_mib,
                       compute_pct=d.compute_pct, whole=d.whole)


def storage_refusal(exc: StateError) -> ManagerError | None:
    """A state the filesystem would not let be read or written, as the refusal it is for the asker.

    No space (or quota) is 507: nothing changed and the same request works
    once there is room again. Any other failure of the filesystem is 503 with
    the system's own words. None when the filesystem is not the cause.
    """
    cause = exc.__cause__
    if not isinstance(cause, OSError):
        return None
    if cause.errno in (errno.ENOSPC, errno.EDQUOT):
        return InsufficientStorage(str(exc))
    return StateUnwritable(str(exc))
