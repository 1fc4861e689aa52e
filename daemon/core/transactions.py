"""The decisions inside a state transaction, kept apart from processes.

Each function here runs inside `StateKeeper.transaction()`: it reads the
document, asks the allocator, and edits the document. The manager calls them
under its lock and acts on processes only after the write is durable. A
failed decision leaves both the state file and the allocator as they were.
"""

from __future__ import annotations

import asyncio
import copy
import errno
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import msgspec
from msgspec.structs import replace

from computegroups.daemon.core.changes import WorkerPid, state_changes, touched
from computegroups.daemon.core.consistency import check_consistent
from computegroups.daemon.core.eventlog import EventLog
from computegroups.daemon.core.instruments import Instruments
from computegroups.daemon.core.views import capacity_refusal, user_name
from computegroups.daemon.core.workers import replica_groups, replica_ref
from computegroups.daemon.model.claims import Claim
from computegroups.daemon.model.config import DaemonConfig
from computegroups.daemon.model.enums import ComponentState, GroupState, Role, Scope
from computegroups.daemon.model.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    InsufficientCapacity,
    InsufficientStorage,
    LimitReached,
    ManagerError,
    NotFound,
    StateUnwritable,
    Unsatisfiable,
)
from computegroups.daemon.model.refs import component_of, uses
from computegroups.daemon.model.requests import ComponentRequest, ReservationRequest
from computegroups.daemon.placement import choices
from computegroups.daemon.placement.allocator import Allocator, DoesNotFitNow, Holding, NeverFits, Placement
from computegroups.statefiles.errors import StateError, StateLockedError
from computegroups.statefiles.journal import Tracked
from computegroups.statefiles.schema import (
    ComponentRecord,
    DeviceRecord,
    GroupRecord,
    ReservationRecord,
    StateDoc,
    WorkerRecord,
)
from computegroups.statefiles.store import StateStore, Transaction
from computegroups.topology.model import Machine

log = logging.getLogger("cgd.manager")


@dataclass(frozen=True)
class Caller:
    """Who is asking, as the kernel says (SO_PEERCRED), never as the body says."""

    pid: int
    uid: int
    gid: int

    @property
    def is_root(self) -> bool:
        return self.uid == 0


def group_ids_for(name: str, scope: Scope, replicas: range) -> dict[str, int | None]:
    """The ids of a component's own groups, each with the replica it serves (None: all of them)."""
    if scope == Scope.ALL_REPLICAS:
        return {f"{name}-all": None}
    return dict(replica_group_ids(name, replicas))


def replica_group_ids(name: str, replicas: range) -> dict[str, int]:
    """The ids of a component's per-replica groups, each with its replica."""
    return {f"{name}-{i}": i for i in replicas}


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
        """Return at the next commit, or after `timeout` seconds: for those who wait for a state to be reached."""
        waiter = asyncio.get_running_loop().create_future()
        self._watchers.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            if waiter in self._watchers:
                self._watchers.remove(waiter)

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
                log.critical("%s", exc)
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
                                   self._gpu_index, self.worker_pid):
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


def group_record(
    machine: Machine, placement: Placement, claim: Claim, *, owner: str, owner_uid: int,
    owner_gid: int, users: tuple[str, ...], scope: Scope, replica: int | None, state: GroupState,
    created: float,
) -> GroupRecord:
    devices = tuple(
        DeviceRecord(
            gpu_index=d.gpu, gpu_uuid=machine.gpu(d.gpu).uuid, mig_uuid=d.mig_uuid,
            memory_mib=d.memory_mib, compute_pct=d.compute_pct, whole=d.whole,
        )
        for d in placement.devices
    )
    return GroupRecord(
        id=placement.group_id, claim=claim, devices=devices, state=state,
        owner=owner, owner_uid=owner_uid, owner_gid=owner_gid, users=users, scope=scope,
        replica=replica,
        domain=tuple(sorted(placement.domain)) if placement.domain else None,
        exclusive_domain=tuple(sorted(placement.exclusive_domain)) if placement.exclusive_domain else None,
        priority=claim.priority, created=created, explanation=placement.score.explanation,
    )


def check_owner(caller: Caller, uid: int, what: str) -> None:
    if not caller.is_root and caller.uid != uid:
        raise Forbidden(f"{what} belongs to {user_name(uid)}; only its owner or root may change it")


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


def check_components_limit(doc: StateDoc, caller: Caller, limit: int) -> None:
    """One user may not hold more than `limit` components (root may): the others need cgd too."""
    if caller.is_root:
        return
    owned = sum(1 for c in doc.components.values() if c.owner_uid == caller.uid)
    if owned >= limit:
        raise LimitReached(f"{user_name(caller.uid)} has {owned} components, the most one user may have "
                           f"(limits.components_per_user = {limit}): release some first")


def check_affinity_targets(doc: StateDoc, claim: Claim | None) -> None:
    """A claim's affinity terms name components that exist: a typo is "no component", not "does not fit"."""
    if claim is None:
        return
    for field, terms in (("affinity", claim.affinity), ("anti_affinity", claim.anti_affinity)):
        for i, term in enumerate(terms):
            if term.component not in doc.components:
                raise NotFound(f"claim.{field}[{i}]: no component named {term.component!r}: "
                               "`cgctl list` shows what exists")


def component_or_404(doc: StateDoc, name: str) -> ComponentRecord:
    comp = doc.components.get(name)
    if comp is None or comp.state == "releasing":
        raise NotFound(f"no component named {name!r}: `cgctl list` shows what exists")
    return comp


def standalone(g: GroupRecord) -> bool:
    """A group made by `POST /v1/groups` (owner `@uid`): nobody's until a component attaches by its id."""
    return g.owner.startswith("@")


def attachable_group(doc: StateDoc, caller: Caller, gid: str) -> GroupRecord:
    """The group a component may attach to by id (`group`), or the refusal that says why not."""
    g = doc.groups.get(gid)
    if g is None:
        raise NotFound(f"no group {gid!r}: `cgctl group list` shows what exists")
    check_owner(caller, g.owner_uid, f"group {gid!r}")
    if not standalone(g):
        raise BadRequest(f"group {gid!r} belongs to {g.owner!r}: attach with share_with {g.owner!r} instead")
    if g.state != GroupState.ALLOCATED:
        raise Conflict(f"group {gid!r} is {g.state}: nothing new may attach to it")
    return g


def check_attachable(g: GroupRecord, users: Iterable[str]) -> None:
    """A draining (or degraded) group keeps what runs on it and takes nothing new: no new
    component, replica, shadow or sharer attaches to it, whoever asks."""
    new = sorted(set(users) - set(g.users))
    if new and g.state in (GroupState.DRAINING, GroupState.DEGRADED):
        raise Conflict(f"group {g.id!r} is {g.state}: nothing new attaches to it ({', '.join(new)}); "
                       f"undrain it first (`cgctl group drain {g.id} --undrain`)")


def attach_refs(doc: StateDoc, group_ids: list[str], refs: list[str]) -> None:
    for gid in group_ids:
        g = doc.groups[gid]
        check_attachable(g, refs)
        users = tuple(sorted(set(g.users) | set(refs)))
        doc.groups[gid] = replace(g, users=users)


def detach_refs(doc: StateDoc, refs: set[str], releasing: set[str]) -> list[str]:
    """Drop replica refs from every group and release the groups nobody needs.

    A group left without users survives only when it is an all-replicas group
    of a component that stays (scaled to zero, it keeps its capacity), or a
    group made on its own, which lives until it is deleted.
    """
    freed = []
    for gid, g in list(doc.groups.items()):
        if refs.isdisjoint(g.users):
            continue
        users = tuple(u for u in g.users if u not in refs)
        owner_stays = standalone(g) or (g.owner in doc.components and g.owner not in releasing)
        if users or (g.scope == "all-replicas" and owner_stays):
            doc.groups[gid] = replace(g, users=users)
        else:
            del doc.groups[gid]
            freed.append(gid)
    return freed


def new_component_records(
    doc: StateDoc, keeper: StateKeeper, request: ComponentRequest, caller: Caller,
) -> ComponentRecord:
    """Decide a new component's groups inside an open transaction."""
    now = keeper.clock()
    name = request.name
    if name in doc.components:
        raise Conflict(f"component {name!r} exists: release it first or pick another name")
    check_components_limit(doc, caller, keeper.config.limits.components_per_user)
    owner = keeper.path_owner(doc, name)
    if owner is not None:
        raise Conflict(f"{name!r} is a path of deployment {owner!r}, whose groups it names: pick another name")
    replicas = request.replicas
    refs_by_replica = {i: replica_ref(name, i) for i in range(replicas)}
    reservation = doc.reservations.get(name)
    if reservation is not None and (request.shadow_of or request.share_with):
        raise Conflict(f"reservation {name!r} exists: allocate it by name or release it first")
    target_name = request.shadow_of or request.share_with
    if target_name is not None:
        target = component_or_404(doc, target_name)
        check_owner(caller, target.owner_uid, f"component {target_name!r}")
        if target.state == "releasing":
            raise Conflict(f"component {target_name!r} is being released")
        if target.shadow_of:
            raise BadRequest(f"{target_name!r} is itself a shadow: attach to its primary {target.shadow_of!r}")
        if request.shadow_of:
            replicas = target.replicas
            refs_by_replica = {i: replica_ref(name, i) for i in range(replicas)}
        for i, ref in refs_by_replica.items():
            if request.scope == "all-replicas":
                targets = sorted({g.id for g in doc.groups.values()
                                  if uses(g.users, target_name)})
            else:
                if i >= target.replicas:
                    raise BadRequest(
                        f"replicas: {target_name!r} has {target.replicas} replicas; "
                        f"per-replica sharing cannot give replica {i} a group"
                    )
                targets = [g.id for g in doc.groups.values() if replica_ref(target_name, i) in g.users]
            attach_refs(doc, targets, [ref])
    elif request.group is not None:
        if reservation is not None:
            raise Conflict(f"reservation {name!r} exists: allocate it by name or release it first")
        attachable_group(doc, caller, request.group)
        attach_refs(doc, [request.group], list(refs_by_replica.values()))
    elif reservation is not None:
        check_owner(caller, reservation.owner_uid, f"reservation {name!r}")
        groups = [doc.groups[g] for g in reservation.group_ids if g in doc.groups]
        if request.claim is not None and groups and request.claim != groups[0].claim:
            raise Conflict(f"reservation {name!r} holds a different claim: omit the claim to take it")
        scope = groups[0].scope if groups else request.scope
        if scope == "per-replica" and replicas != len(groups):
            raise BadRequest(f"replicas: reservation {name!r} holds {len(groups)} per-replica groups")
        for g in groups:
            users = tuple(refs_by_replica.values()) if g.scope == "all-replicas" else (
                replica_ref(name, g.replica or 0),)
            doc.groups[g.id] = replace(g, state=GroupState.ALLOCATED, owner=name, users=users)
        del doc.reservations[name]
        request = msgspec.structs.replace(
            request, claim=groups[0].claim if groups else request.claim, scope=scope)
    else:
        if request.claim is None and not keeper.machine.gpus:
            # Nothing to claim on a machine without GPUs: the component runs CPU-only, no CPUs counted.
            request = msgspec.structs.replace(request, claim=Claim(cpus=0))
        if request.claim is None:
            raise BadRequest("claim: required (or share_with, shadow_of, group, or a reservation of this name)")
        check_affinity_targets(doc, request.claim)
        ids = group_ids_for(name, request.scope, range(replicas))
        placements = keeper.place(doc, request.claim, list(ids), name)
        drop_displaced(doc, placements)
        for p in placements:
            replica = ids[p.group_id]
            users = tuple(refs_by_replica.values()) if replica is None else (replica_ref(name, replica),)
            doc.groups[p.group_id] = group_record(
                keeper.machine, p, request.claim, owner=name, owner_uid=caller.uid,
                owner_gid=caller.gid, users=users, scope=request.scope, replica=replica,
                state=GroupState.ALLOCATED, created=now,
            )
    comp = ComponentRecord(
        name=name, owner_uid=caller.uid, owner_gid=caller.gid, spec=request.spec(), replicas=replicas,
        state=ComponentState.RUNNING if request.command else ComponentState.ALLOCATED, deployment=None,
        shadow_of=request.shadow_of, lease_pid=caller.pid if request.lease else None,
        lease_start=None, created=now,
    )
    doc.components[name] = comp
    if request.command:
        role = Role.SHADOW if request.shadow_of else Role.PRIMARY
        for i in range(replicas):
            doc.workers[replica_ref(name, i)] = WorkerRecord(
                component=name, replica=i, role=role, pid=None, create_time=None,
                started_at=now, restarts=0, promotions=0, last_promoted_at=None,
            )
    return comp


def drop_displaced(doc: StateDoc, placements: tuple[Placement, ...]) -> None:
    """Reservations a higher priority claim took over lose all their groups."""
    displaced = {gid for p in placements for gid in p.displaced}
    if not displaced:
        return
    for name, res in list(doc.reservations.items()):
        if displaced & set(res.group_ids):
            log.warning("reservation %s displaced by a higher-priority claim", name)
            for gid in res.group_ids:
                doc.groups.pop(gid, None)
            del doc.reservations[name]


def new_reservation(
    doc: StateDoc, keeper: StateKeeper, request: ReservationRequest, caller: Caller,
) -> ReservationRecord:
    name = request.name
    if name in doc.reservations:
        raise Conflict(f"reservation {name!r} exists: release it first or pick another name")
    if name in doc.components:
        raise Conflict(f"component {name!r} exists already: a reservation is taken by allocating its name")
    owner = keeper.path_owner(doc, name)
    if owner is not None:
        raise Conflict(f"{name!r} is a path of deployment {owner!r}, whose groups it names: pick another name")
    check_affinity_targets(doc, request.claim)
    ids = group_ids_for(name, request.scope, range(request.replicas))
    placements = keeper.place(doc, request.claim, list(ids), name, reserved=True)
    drop_displaced(doc, placements)
    now = keeper.clock()
    for p in placements:
        replica = ids[p.group_id]
        doc.groups[p.group_id] = group_record(
            keeper.machine, p, request.claim, owner=name, owner_uid=caller.uid,
            owner_gid=caller.gid, users=(), scope=request.scope, replica=replica,
            state=GroupState.RESERVED, created=now,
        )
    record = ReservationRecord(
        name=name, owner_uid=caller.uid, owner_gid=caller.gid, group_ids=tuple(ids),
        spec=request.spec(),
        expires_at=now + request.ttl_s, priority=request.claim.priority,
    )
    doc.reservations[name] = record
    return record


def release_reservation(doc: StateDoc, name: str) -> list[str]:
    res = doc.reservations.pop(name)
    for gid in res.group_ids:
        doc.groups.pop(gid, None)
    return list(res.group_ids)


def dependents(doc: StateDoc, name: str) -> tuple[list[str], list[str]]:
    """(shadows, sharers): components attached to `name`'s groups."""
    shadows = sorted(c.name for c in doc.components.values() if c.shadow_of == name)
    own = {gid for gid, g in doc.groups.items() if g.owner == name}
    sharers = sorted({
        component_of(u) for gid in own for u in doc.groups[gid].users
        if component_of(u) not in (name, *shadows)
    })
    return shadows, sharers


def hand_back_primary(doc: StateDoc, releasing: set[str]) -> tuple[list[str], list[str]]:
    """Inside a transaction: a released shadow that serves as primary (promoted
    when its primary died) hands the role back to the primary component's
    worker of that replica, which would otherwise stay a shadow of nobody.
    Returns the workers that are primary again and the released ones now
    shadows, whose role files say so before they are stopped."""
    handed, demoted = [], []
    for name in sorted(releasing):
        comp = doc.components.get(name)
        if comp is None or comp.shadow_of is None or comp.shadow_of in releasing:
            continue
        for w in [w for w in doc.workers.values() if w.component == name and w.role == Role.PRIMARY]:
            ref = replica_ref(comp.shadow_of, w.replica)
            back = doc.workers.get(ref)
            if back is not None and back.role == Role.SHADOW and back.outcome is None:
                doc.workers[ref] = replace(back, role=Role.PRIMARY)
                doc.workers[w.key] = replace(w, role=Role.SHADOW)
                handed.append(ref)
                demoted.append(w.key)
    return handed, demoted


def remove_component(doc: StateDoc, keeper: StateKeeper, name: str, releasing: set[str]) -> list[str]:
    """Forget a component whose workers are already stopped; returns freed groups."""
    comp = doc.components[name]
    refs = {replica_ref(name, i) for i in range(max(comp.replicas, 1))}
    refs |= {u for g in doc.groups.values() if uses(g.users, name) for u in g.users if component_of(u) == name}
    for key in [k for k, w in doc.workers.items() if w.component == name]:
        del doc.workers[key]
    freed = detach_refs(doc, refs, releasing)
    reserved = {gid for r in doc.reservations.values() for gid in r.group_ids}
    for gid, g in list(doc.groups.items()):
        if g.owner == name and not g.users and gid not in reserved:
            del doc.groups[gid]
            freed.append(gid)
    del doc.components[name]
    return freed


def check_scale_in(doc: StateDoc, comp: ComponentRecord, replicas: int) -> None:
    """Refuse a scale-in that would pull groups from under a sharer's replicas."""
    shadows = set(dependents(doc, comp.name)[0])
    for i in range(replicas, comp.replicas):
        for g in replica_groups(doc, comp.name, i):
            if g.scope == "per-replica":
                others = sorted({component_of(u) for u in g.users} - {comp.name} - shadows)
                if others:
                    raise Conflict(f"component {others[0]!r} uses group {g.id!r} of replica {i}: "
                                   "release or scale it first")
    for other in dependents(doc, comp.name)[1]:
        dep = doc.components[other]
        if dep.spec.scope == Scope.PER_REPLICA and dep.replicas > replicas:
            raise Conflict(
                f"component {other!r} shares {comp.name!r} replica by replica with "
                f"{dep.replicas} replicas: scale it down first"
            )


def scale_component(
    doc: StateDoc, keeper: StateKeeper, comp: ComponentRecord, replicas: int,
) -> ComponentRecord:
    """Change a component's replica count and, with it, its shadows'.

    Scale-out places exactly the new per-replica groups; scale-in frees
    exactly the removed replicas' per-replica groups; all-replicas groups stay.
    """
    old = comp.replicas
    request = ComponentRequest.from_spec(comp.name, comp.spec)
    now = keeper.clock()
    shadows, _ = dependents(doc, comp.name)
    if replicas < old:
        check_scale_in(doc, comp, replicas)
        removed = {replica_ref(n, i) for n in (comp.name, *shadows) for i in range(replicas, old)}
        for key in [k for k in doc.workers if k in removed]:
            del doc.workers[key]
        detach_refs(doc, removed, set())
    elif replicas > old:
        new = range(old, replicas)
        if request.share_with:
            target = doc.components[request.share_with]
            for i in new:
                ref = replica_ref(comp.name, i)
                if request.scope == "all-replicas":
                    targets = sorted({g.id for g in doc.groups.values()
                                      if uses(g.users, target.name)})
                else:
                    if i >= target.replicas:
                        raise BadRequest(f"replicas: {target.name!r} has only {target.replicas} replicas to share")
                    targets = [g.id for g in doc.groups.values() if replica_ref(target.name, i) in g.users]
                attach_refs(doc, targets, [ref])
        elif request.group is not None:
            attach_refs(doc, [request.group], [replica_ref(comp.name, i) for i in new])
        elif request.scope == "all-replicas":
            attach_refs(doc, [f"{comp.name}-all"], [replica_ref(comp.name, i) for i in new])
        else:
            assert request.claim is not None
            ids = replica_group_ids(comp.name, new)
            placements = keeper.place(doc, request.claim, list(ids), comp.name)
            drop_displaced(doc, placements)
            for p in placements:
                replica = ids[p.group_id]
                doc.groups[p.group_id] = group_record(
                    keeper.machine, p, request.claim, owner=comp.name, owner_uid=comp.owner_uid,
                    owner_gid=comp.owner_gid, users=(replica_ref(comp.name, replica),),
                    scope=Scope.PER_REPLICA, replica=replica, state=GroupState.ALLOCATED, created=now,
                )
        for shadow in shadows:
            for i in new:
                targets = [g.id for g in replica_groups(doc, comp.name, i)]
                attach_refs(doc, targets, [replica_ref(shadow, i)])
        for name in (comp.name, *shadows):
            member = doc.components[name]
            if member.spec.command:
                role = Role.SHADOW if member.shadow_of else Role.PRIMARY
                for i in new:
                    doc.workers[replica_ref(name, i)] = WorkerRecord(
                        component=name, replica=i, role=role, pid=None, create_time=None,
                        started_at=now, restarts=0, promotions=0, last_promoted_at=None,
                    )
    for name in (comp.name, *shadows):
        doc.components[name] = replace(doc.components[name], replicas=replicas)
    return doc.components[comp.name]
