"""The operations of cgd: decide under the lock, write durably, then act.

Every public coroutine here is one API operation. Decisions live in
`computegroups.daemon.core.transactions`; processes are only touched through the supervisor,
and only after the state that asks for them is on disk (or, when stopping,
before the state forgets them).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from msgspec.structs import replace

from computegroups.daemon.core.transactions import (
    Caller,
    StateKeeper,
    check_owner,
    check_scale_in,
    component_or_404,
    dependents,
    drop_displaced,
    group_record,
    new_component_records,
    new_reservation,
    release_reservation,
    remove_component,
    scale_component,
)
from computegroups.daemon.core.views import component_view, group_view, reservation_view
from computegroups.daemon.core.workers import (
    WorkerPaths,
    build_env,
    build_spec,
    groups_by_replica,
    parse_watcher_key,
    replica_ref,
    visible_devices,
    watcher_key,
    write_role,
)
from computegroups.daemon.model.claims import Claim
from computegroups.daemon.model.enums import ComponentState, GroupState, Role, Scope
from computegroups.daemon.model.errors import BadRequest, Conflict, Forbidden, NotFound
from computegroups.daemon.model.refs import ReplicaRef, component_of
from computegroups.daemon.model.requests import ComponentRequest, ReservationRequest
from computegroups.daemon.supervision.processes import start_time
from computegroups.daemon.supervision.proctree import is_alive
from computegroups.daemon.supervision.supervisor import Supervisor, WorkerExit, WorkerStart
from computegroups.daemon.supervision.workerenv import owner_env
from computegroups.daemon.supervision.worklogs import read_worker_log
from computegroups.statefiles.schema import StateDoc

log = logging.getLogger("cgd.manager")

PROMOTION_MIN_UPTIME_S = 1.0
"""A shadow younger than this is still starting (its signal handler may not be
installed, and the promotion signal would end it): the dead primary restarts
under its own restart policy instead, and no promotion loop can form."""


class Manager:
    def __init__(self, keeper: StateKeeper, supervisor: Supervisor, paths: WorkerPaths) -> None:
        self.keeper = keeper
        self.supervisor = supervisor
        self.paths = paths
        self.config = keeper.config
        self.replica_states: dict[str, str] = {}
        self._stopping: set[str] = set()
        self._busy: dict[str, str] = {}
        """Components whose workers are being stopped outside the lock, and why.

        Stopping can take a worker's whole grace period; the lock is not held
        for it, so other users are not stalled, and these names are refused
        to any other change until the operation that stops them commits."""
        self._tasks: set[asyncio.Task] = set()
        self._adhoc = 0

    @property
    def doc(self) -> StateDoc:
        return self.keeper.doc

    # -- supervisor callbacks -------------------------------------------------

    def on_worker_exit(self, event: WorkerExit) -> None:
        self._spawn(self._handle_exit(event))

    def on_worker_start(self, event: WorkerStart) -> None:
        self._spawn(self._record_start(event))

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        """A failed exit or start handler is logged now, not when the task is collected (or never)."""
        self._tasks.discard(task)
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            log.error("handling a worker event failed: %s", exc, exc_info=exc)

    async def _record_start(self, event: WorkerStart) -> None:
        component, replica = parse_watcher_key(event.key)
        ref = replica_ref(component, replica)
        async with self.keeper.lock:
            worker = self.doc.workers.get(ref)
            if worker is None or (worker.pid == event.pid and worker.create_time == event.create_time):
                return
            with self.keeper.transaction() as doc:
                if ref in doc.workers:
                    doc.workers[ref] = replace(doc.workers[ref], pid=event.pid, create_time=event.create_time)
            self.replica_states[ref] = "running"

    async def _handle_exit(self, event: WorkerExit) -> None:
        component, replica = parse_watcher_key(event.key)
        ref = replica_ref(component, replica)
        if event.key in self._stopping:
            return
        partner = self._failover(ref)
        async with self.keeper.lock:
            doc = self.doc
            comp = doc.components.get(component)
            worker = doc.workers.get(ref)
            if comp is None or comp.state == "releasing" or worker is None or event.key in self._stopping:
                return
            if partner is not None:
                await self._promote(ref, partner)
                return
            log.warning("worker %s (pid %s) exited with %s; %s", ref, event.pid, event.returncode,
                        "restarting" if event.will_restart else "not restarting")
            self.replica_states[ref] = "restarting" if event.will_restart else "failed"
            with self.keeper.transaction() as doc:
                w = doc.workers.get(ref)
                if w is not None:
                    doc.workers[ref] = replace(
                        w, pid=None, create_time=None,
                        restarts=w.restarts + (1 if event.will_restart else 0),
                    )
                if not event.will_restart and ref in doc.workers and component in doc.components:
                    doc.components[component] = replace(doc.components[component], state=ComponentState.FAILED)

    def _failover(self, dead_ref: str) -> str | None:
        """Tell the dead primary's shadow it serves now, before waiting for the lock.

        The lock may be held for seconds (an allocation spawning a hundred
        workers); the shadow must hear within milliseconds of the death. The
        state records the promotion once the lock is free (`_promote`).
        Returns the promoted shadow's ref, or None when there is none.
        """
        doc = self.doc
        dead = doc.workers.get(dead_ref)
        comp = doc.components.get(dead.component) if dead is not None else None
        if dead is None or comp is None or comp.state == "releasing" or dead.role != "primary":
            return None
        partner_ref = self.standby_partner(doc, dead.component, dead.replica)
        if partner_ref is None:
            return None
        partner = doc.workers[partner_ref]
        owner = doc.components[partner.component]
        write_role(self.paths, partner.component, partner.replica, "primary", owner.owner_uid, owner.owner_gid)
        self.supervisor.signal(watcher_key(partner.component, partner.replica), self.config.promotion_signal)
        log.warning("promoted %s to primary after %s died", partner_ref, dead_ref)
        return partner_ref

    def standby_partner(self, doc: StateDoc, component: str, replica: int) -> str | None:
        """The live shadow that takes over when this primary dies, if any."""
        comp = doc.components[component]
        partners = [comp.shadow_of] if comp.shadow_of else dependents(doc, component)[0]
        for name in partners:
            ref = replica_ref(name, replica)
            w = doc.workers.get(ref)
            key = watcher_key(name, replica)
            if name in self._busy or key in self._stopping or doc.components[name].state == "releasing":
                continue  # a shadow on its way out would leave the primary's replica with no primary
            if (w and w.role == "shadow" and w.pid and w.create_time
                    and self.supervisor.is_running(key)
                    and time.time() - w.create_time >= PROMOTION_MIN_UPTIME_S):
                return ref
        return None

    async def _promote(self, dead_ref: str, partner_ref: str) -> None:
        """Record a promotion `_failover` made: the shadow serves now, the dead
        primary comes back as its shadow. Called with the lock held."""
        if partner_ref not in self.doc.workers:
            return
        with self.keeper.transaction() as doc:
            swap_roles(doc, dead_ref, partner_ref, self.keeper.clock())
        dead = self.doc.workers[dead_ref]
        key = watcher_key(dead.component, dead.replica)
        self._stopping.add(key)
        try:
            await self.supervisor.stop_worker(key, timeout=0)
        finally:
            self._stopping.discard(key)
        await self.start_workers([dead_ref])

    # -- starting and stopping ------------------------------------------------

    async def start_workers(self, refs: list[str]) -> None:
        """Start workers the state already asks for, then record their pids."""
        started = {}
        for ref in refs:
            w = self.doc.workers[ref]
            comp = self.doc.components[w.component]
            write_role(self.paths, comp.name, w.replica, w.role, comp.owner_uid, comp.owner_gid)
            spec = build_spec(self.doc, comp, w.replica, w.role, self.paths, self.config)
            started[ref] = await self.supervisor.start_worker(spec)
            self.replica_states[ref] = "running"
        with self.keeper.transaction() as doc:
            for ref, ev in started.items():
                if ref in doc.workers:
                    doc.workers[ref] = replace(doc.workers[ref], pid=ev.pid, create_time=ev.create_time)
            for name in {doc.workers[ref].component for ref in started if ref in doc.workers}:
                failed = doc.components.get(name)
                if failed is not None and failed.state == ComponentState.FAILED and all(
                        w.pid for w in doc.workers.values() if w.component == name):
                    doc.components[name] = replace(failed, state=ComponentState.RUNNING)

    async def stop_workers(self, refs: list[str]) -> None:
        """Stop workers all at once: each may take its whole grace period."""
        keys = []
        for ref in refs:
            w = self.doc.workers.get(ref)
            if w is None:
                continue
            key = watcher_key(w.component, w.replica)
            self._stopping.add(key)
            keys.append((ref, key, w))

        async def stop(ref: str, key: str, w) -> None:
            if self.supervisor.is_running(key) or self.supervisor.supervises(key):
                await self.supervisor.stop_worker(key)
            elif w.pid and w.create_time:
                await self.supervisor.stop_stray(w.pid, w.create_time, 10.0)
            self.replica_states.pop(ref, None)

        try:
            results = await asyncio.gather(*(stop(ref, key, w) for ref, key, w in keys), return_exceptions=True)
            failures = [r for r in results if isinstance(r, BaseException)]
            if failures:
                raise failures[0]
        finally:
            for _, key, _ in keys:
                self._stopping.discard(key)

    # -- operations -------------------------------------------------------------

    async def allocate(self, caller: Caller, request: ComponentRequest) -> dict[str, Any]:
        if request.cwd is not None and not os.path.isdir(request.cwd):
            raise BadRequest(f"cwd: {request.cwd} is not a directory")
        if request.command:
            try:
                owner_env(caller.uid, caller.gid)
            except ValueError as exc:
                raise BadRequest(f"cannot run workers for the caller: {exc}") from None
        async with self.keeper.lock:
            self.check_idle(request.name)
            self.check_groups_idle(request.shadow_of or request.share_with)
            before = self.doc
            with self.keeper.transaction() as doc:
                comp = new_component_records(doc, self.keeper, request, caller)
                if request.lease:
                    doc.components[comp.name] = replace(comp, lease_start=start_time(caller.pid))
            refs = sorted(ref for ref, w in self.doc.workers.items() if w.component == request.name)
            await self.start_or_undo(refs, before, f"the workers of {request.name!r}")
            return self.component(request.name)

    async def start_or_undo(self, refs: list[str], before: StateDoc, what: str) -> None:
        """Start the workers a change just committed, or put the state back as it was before it.

        Putting back the earlier document (not releasing what was added)
        matters when the change took over a reservation: a failed start must
        leave the reservation held, not consume it. The lock is held since
        `before` was read, so nothing else changed in between.
        """
        try:
            await self.start_workers(refs)
        except Exception as exc:
            log.error("starting %s failed: %s; undoing the change", what, exc)
            await self.stop_workers(refs)
            self.keeper.restore(before)
            for ref in refs:
                self.replica_states.pop(ref, None)
            raise BadRequest(f"could not start {what}: {exc}") from None

    def mark_busy(self, names: list[str], why: str) -> None:
        """Claim components for an operation that stops their workers outside the lock."""
        self.check_idle(*names)
        for name in names:
            self._busy[name] = why

    def busy_components(self) -> dict[str, str]:
        return dict(self._busy)

    def clear_busy(self, names: list[str]) -> None:
        for name in names:
            self._busy.pop(name, None)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait for the operations stopping workers outside the lock to commit; False if some are left."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._busy and loop.time() < deadline:
            await asyncio.sleep(0.05)
        return not self._busy

    def check_idle(self, *names: str | None) -> None:
        """Refuse a change to a component another operation is still stopping workers of."""
        for name in names:
            if name is not None and name in self._busy:
                raise Conflict(f"component {name!r} is {self._busy[name]}: try again once that is done")

    def check_groups_idle(self, name: str | None) -> None:
        """Refuse to attach to `name`'s groups while the component owning one of them is busy:
        a scale-in meanwhile would pull that group from under the new user."""
        if name is None:
            return
        owners = {g.owner for g in self.doc.groups.values() if any(component_of(u) == name for u in g.users)}
        self.check_idle(name, *sorted(owners))

    async def release(self, caller: Caller, name: str) -> dict[str, Any]:
        async with self.keeper.lock:
            self.check_idle(name)
            comp = self.doc.components.get(name)
            if comp is None or comp.state != "releasing":  # a release whose stop failed may be retried
                comp = component_or_404(self.doc, name)
            check_owner(caller, comp.owner_uid, f"component {name!r}")
            if comp.deployment:
                raise BadRequest(f"{name!r} belongs to deployment {comp.deployment!r}: delete or scale it there")
            closure, refs = self._begin_release([name])
        return await self._finish_release(closure, refs)

    async def release_all(self, caller: Caller) -> dict[str, Any]:
        async with self.keeper.lock:
            mine = [c.name for c in self.doc.components.values()
                    if c.owner_uid == caller.uid and c.state != "releasing" and not c.deployment
                    and c.name not in self._busy]
            closure, refs = self._begin_release(mine)
        return await self._finish_release(closure, refs)

    def _begin_release(self, names: list[str]) -> tuple[list[str], list[str]]:
        """Under the lock: mark the components and their shadows releasing, durably.

        From here on their exits restart nothing and nobody can attach to
        them; if cgd dies before `_finish_release`, recovery finishes it.
        """
        doc = self.doc
        closure: list[str] = []
        for name in names:
            for member in (name, *dependents(doc, name)[0]):
                if member not in closure:
                    closure.append(member)
        self.check_idle(*closure)
        for name in closure:
            sharers = [s for s in dependents(doc, name)[1] if s not in closure]
            if sharers:
                raise Conflict(f"component {sharers[0]!r} shares the groups of {name!r}: release it first")
        if closure:
            with self.keeper.transaction() as doc:
                for name in closure:
                    doc.components[name] = replace(doc.components[name], state=ComponentState.RELEASING)
        self.mark_busy(closure, "being released")
        return closure, [ref for ref, w in self.doc.workers.items() if w.component in closure]

    async def _finish_release(self, closure: list[str], refs: list[str]) -> dict[str, Any]:
        """Without the lock: stop the workers; then, under it, free the groups."""
        try:
            await self.stop_workers(refs)
            freed: list[str] = []
            async with self.keeper.lock:
                present = [n for n in closure if n in self.doc.components]
                if present:
                    with self.keeper.transaction() as doc:
                        for name in sorted(present, key=lambda n: doc.components[n].shadow_of is None):
                            freed.extend(remove_component(doc, self.keeper, name, set(present)))
        finally:
            self.clear_busy(closure)
        return {"released": closure, "groups": sorted(freed)}

    async def scale(self, caller: Caller, name: str, replicas: int) -> dict[str, Any]:
        async with self.keeper.lock:
            comp = component_or_404(self.doc, name)
            check_owner(caller, comp.owner_uid, f"component {name!r}")
            if comp.shadow_of:
                raise BadRequest(f"{name!r} is a shadow of {comp.shadow_of!r}: scale the primary")
            if comp.deployment:
                raise BadRequest(f"{name!r} belongs to deployment {comp.deployment!r}: scale it there")
            if comp.state == "releasing":
                raise Conflict(f"component {name!r} is being released")
            shadows, _ = dependents(self.doc, name)
            members = (name, *shadows)
            self.check_idle(*members)
            self.check_groups_idle(comp.spec.share_with)
            old = comp.replicas
            if replicas >= old:
                before = self.doc
                with self.keeper.transaction() as doc:
                    scale_component(doc, self.keeper, doc.components[name], replicas)
                fresh = [replica_ref(n, i) for n in members for i in range(old, replicas)]
                await self.start_or_undo([r for r in fresh if r in self.doc.workers], before,
                                          f"the new replicas of {name!r}")
                return self.component(name)
            check_scale_in(self.doc, comp, replicas)
            gone = [replica_ref(n, i) for n in members for i in range(replicas, old)]
            self.mark_busy(list(members), "being scaled in")
        try:
            await self.stop_workers(gone)
            async with self.keeper.lock:
                try:
                    with self.keeper.transaction() as doc:
                        scale_component(doc, self.keeper, doc.components[name], replicas)
                except BaseException:
                    await self.start_workers([r for r in gone if r in self.doc.workers])
                    raise
                return self.component(name)
        finally:
            self.clear_busy(list(members))

    async def restart(self, caller: Caller, name: str, replica: int | None) -> dict[str, Any]:
        """Stop and start a component's workers (one replica, or all) with the same groups and role.

        The way back for a replica that used up its restarts (`failed`), or
        for a worker that should reread its files. Its shadow is not promoted:
        this is not a death.
        """
        async with self.keeper.lock:
            comp = component_or_404(self.doc, name)
            check_owner(caller, comp.owner_uid, f"component {name!r}")
            if not comp.spec.command:
                raise BadRequest(f"{name!r} runs no command: there is nothing to restart")
            if comp.state == "lost":
                raise Conflict(f"component {name!r} is lost: its GPUs are gone; release it")
            if replica is not None and not 0 <= replica < comp.replicas:
                raise NotFound(f"{name!r} has replicas 0..{comp.replicas - 1}, not {replica}")
            self.mark_busy([name], "being restarted")
            indices = range(comp.replicas) if replica is None else [replica]
            refs = [r for r in (replica_ref(name, i) for i in indices) if r in self.doc.workers]
        try:
            await self.stop_workers(refs)
            async with self.keeper.lock:
                with self.keeper.transaction() as doc:
                    for ref in refs:
                        doc.workers[ref] = replace(doc.workers[ref], pid=None, create_time=None)
                try:
                    await self.start_workers(refs)
                except Exception as exc:
                    self._mark_failed(name, refs)
                    raise BadRequest(f"could not start the workers of {name!r} again: {exc}") from None
                log.info("restarted %s at the request of uid %d", ", ".join(refs), caller.uid)
                return self.component(name)
        finally:
            self.clear_busy([name])

    def _mark_failed(self, name: str, refs: list[str]) -> None:
        """After a start that failed part-way: what did not start is failed, and so is the component."""
        for ref in refs:
            w = self.doc.workers[ref]
            if self.supervisor.is_running(watcher_key(w.component, w.replica)):
                continue
            self.replica_states[ref] = "failed"
        with self.keeper.transaction() as doc:
            if name in doc.components:
                doc.components[name] = replace(doc.components[name], state=ComponentState.FAILED)

    async def reserve(self, caller: Caller, request: ReservationRequest) -> dict[str, Any]:
        async with self.keeper.lock:
            self.check_idle(request.name)
            with self.keeper.transaction() as doc:
                record = new_reservation(doc, self.keeper, request, caller)
            return reservation_view(self.doc, self.doc.reservations[record.name])

    async def unreserve(self, caller: Caller, name: str) -> dict[str, Any]:
        async with self.keeper.lock:
            res = self.doc.reservations.get(name)
            if res is None:
                raise NotFound(f"no reservation named {name!r}")
            check_owner(caller, res.owner_uid, f"reservation {name!r}")
            with self.keeper.transaction() as doc:
                groups = release_reservation(doc, name)
            return {"released": name, "groups": groups}

    async def create_group(self, caller: Caller, claim: Claim) -> dict[str, Any]:
        async with self.keeper.lock:
            with self.keeper.transaction() as doc:
                n = max([int(g.split(".", 1)[1]) for g in doc.groups if g.startswith("group.")] + [0]) + 1
                gid = f"group.{n}"
                (placement,) = self.keeper.place(doc, claim, [gid], f"@{caller.uid}")
                drop_displaced(doc, (placement,))
                doc.groups[gid] = group_record(
                    self.keeper.machine, placement, claim, owner=f"@{caller.uid}",
                    owner_uid=caller.uid, owner_gid=caller.gid, users=(), scope=Scope.ALL_REPLICAS,
                    replica=None, state=GroupState.ALLOCATED, created=self.keeper.clock(),
                )
            return group_view(self.doc, self.doc.groups[gid])

    async def delete_group(self, caller: Caller, gid: str) -> dict[str, Any]:
        async with self.keeper.lock:
            g = self.group_record(gid)
            check_owner(caller, g.owner_uid, f"group {gid!r}")
            if not g.owner.startswith("@"):
                raise Conflict(f"group {gid!r} belongs to {g.owner!r}: release that instead")
            with self.keeper.transaction() as doc:
                del doc.groups[gid]
            return {"released": gid}

    async def drain_group(self, caller: Caller, gid: str) -> dict[str, Any]:
        async with self.keeper.lock:
            g = self.group_record(gid)
            check_owner(caller, g.owner_uid, f"group {gid!r}")
            if g.state in ("lost", "reserved"):
                raise Conflict(f"group {gid!r} is {g.state} and cannot drain")
            if g.state in ("draining", "degraded"):  # degraded: its GPU is drained already; keep saying why
                return group_view(self.doc, g)
            with self.keeper.transaction() as doc:
                doc.groups[gid] = replace(doc.groups[gid], state=GroupState.DRAINING)
            return group_view(self.doc, self.doc.groups[gid])

    async def undrain_group(self, caller: Caller, gid: str) -> dict[str, Any]:
        """Let new work land on a drained group's devices again; a degraded one waits for its GPU's undrain."""
        async with self.keeper.lock:
            g = self.group_record(gid)
            check_owner(caller, g.owner_uid, f"group {gid!r}")
            if g.state == "degraded":
                raise Conflict(f"group {gid!r} is degraded: its GPU failed; undrain the GPU once it is healthy")
            if g.state != "draining":
                return group_view(self.doc, g)
            with self.keeper.transaction() as doc:
                doc.groups[gid] = replace(doc.groups[gid], state=GroupState.ALLOCATED)
            return group_view(self.doc, self.doc.groups[gid])

    async def drain_gpu(self, caller: Caller, index: int, drain: bool) -> dict[str, Any]:
        async with self.keeper.lock:
            try:
                gpu = self.keeper.machine.gpu(index)
            except KeyError:
                raise NotFound(f"no GPU {index}: `cgctl topo` lists the GPUs") from None
            groups = [g for g in self.doc.groups.values() if any(d.gpu_index == index for d in g.devices)]
            if not caller.is_root and caller.uid != os.geteuid():
                raise Forbidden(f"draining GPU {index} takes root (or cgd's own user): "
                                "it affects every user of the GPU")
            with self.keeper.transaction() as doc:
                drained = [u for u in doc.drained if u != gpu.uuid]
                if drain:
                    drained.append(gpu.uuid)
                doc.drained = tuple(drained)
                for g in groups:
                    current = doc.groups[g.id]
                    if drain and current.state == "allocated":
                        doc.groups[g.id] = replace(current, state=GroupState.DRAINING)
                    elif not drain and current.state in ("draining", "degraded") and index not in self.keeper.unhealthy:
                        doc.groups[g.id] = replace(current, state=GroupState.ALLOCATED)
                if not drain:
                    for name, comp in list(doc.components.items()):
                        mine = [g for g in doc.groups.values() if any(component_of(u) == name for u in g.users)]
                        if comp.state == "degraded" and not any(g.state == "degraded" for g in mine):
                            state = ComponentState.RUNNING if comp.spec.command else ComponentState.ALLOCATED
                            doc.components[name] = replace(comp, state=state)
            return {"gpu": index, "drained": drain, "groups": sorted(g.id for g in groups)}

    # -- health, leases, expiry -------------------------------------------------

    def worker_pids_and_shares(self) -> tuple[dict[int, str], dict[tuple[str, int], int]]:
        roots: dict[int, str] = {}
        for ref, pids in self._pids().items():
            for pid in pids:
                roots[pid] = ref
        shares = {
            (ref, d.gpu_index): d.memory_mib
            for ref, groups in groups_by_replica(self.doc).items()
            for d in visible_devices(groups) if not d.whole
        }
        return roots, shares

    async def apply_health(self, facts) -> None:
        """Drain GPUs that failed, mark their groups degraded, account foreign memory."""
        foreign = {i: sum(p["used_memory_mib"] or 0 for p in f.foreign) for i, f in facts.items()}
        self.keeper.foreign = foreign
        self.keeper.allocator.set_foreign(foreign)
        failed = {i for i, f in facts.items() if f.health != "ok"}
        async with self.keeper.lock:
            self.keeper.unhealthy = failed
            self.keeper.allocator.set_unavailable(self.keeper.unavailable_gpus(self.doc))
            uuids = {self.keeper.machine.gpu(i).uuid for i in failed}
            newly = uuids - set(self.doc.drained)
            hit = [g.id for g in self.doc.groups.values()
                   if g.state in ("allocated", "draining") and any(d.gpu_uuid in uuids for d in g.devices)]
            if newly or hit:
                for i in sorted(failed):
                    log.error("GPU %d failed: %s; draining it", i, "; ".join(facts[i].reasons))
                with self.keeper.transaction() as doc:
                    doc.drained = tuple(sorted(set(doc.drained) | uuids))
                    for gid in hit:
                        doc.groups[gid] = replace(doc.groups[gid], state=GroupState.DEGRADED)
                    for name in {component_of(u) for gid in hit for u in doc.groups[gid].users}:
                        if name in doc.components and doc.components[name].state != "releasing":
                            doc.components[name] = replace(doc.components[name], state=ComponentState.DEGRADED)
        for i, f in facts.items():
            for over in f.over_share:
                log.warning("worker %s uses %d MiB on GPU %d, over its share of %d MiB",
                            over["replica"], over["used_memory_mib"], i, over["share_mib"])
                if self.config.share_enforcement == "stop":
                    over_ref = ReplicaRef.parse(over["replica"])
                    key = watcher_key(over_ref.component, over_ref.replica)
                    if self.supervisor.is_running(key):
                        self._stopping.add(key)
                        try:
                            await self.supervisor.stop_worker(key)
                        finally:
                            self._stopping.discard(key)
                        self.replica_states[over["replica"]] = "stopped-over-share"

    async def expire(self) -> None:
        """Release reservations past their time and leases whose client died.

        Each is handled on its own: one that cannot be released now (a lease
        someone still shares) must not hold back the others.
        """
        now = self.keeper.clock()
        async with self.keeper.lock:
            expired = [r.name for r in self.doc.reservations.values() if r.expires_at <= now]
            if expired:
                with self.keeper.transaction() as doc:
                    for name in expired:
                        release_reservation(doc, name)
                log.info("reservations expired: %s", ", ".join(expired))
            dead = [c for c in self.doc.components.values()
                    if c.lease_pid and c.state != "releasing" and c.name not in self._busy
                    and not is_alive(c.lease_pid, c.lease_start)]
        for record in dead:
            name = record.name
            try:
                async with self.keeper.lock:
                    if self.doc.components.get(name) != record or name in self._busy:
                        continue  # released, or another component of that name, since the list was made
                    closure, refs = self._begin_release([name])
                await self._finish_release(closure, refs)
                log.warning("released %s: the client that held its lease is gone", name)
            except Conflict as exc:
                log.warning("lease of %s ended but it cannot be released yet: %s", name, exc)

    # -- reads --------------------------------------------------------------------

    def group_record(self, gid: str):
        g = self.doc.groups.get(gid)
        if g is None:
            raise NotFound(f"no group {gid!r}: `cgctl list` shows the groups in use")
        return g

    def component(self, name: str) -> dict[str, Any]:
        comp = component_or_404(self.doc, name)
        return component_view(self.doc, comp, self._pids(), self.config.device_naming, self.replica_states)

    def components(self, owner: int | None = None) -> list[dict[str, Any]]:
        pids = self._pids()
        return [
            component_view(self.doc, c, pids, self.config.device_naming, self.replica_states)
            for c in sorted(self.doc.components.values(), key=lambda c: c.name)
            if c.state != "releasing" and (owner is None or c.owner_uid == owner)
        ]

    def reservations(self) -> list[dict[str, Any]]:
        return [reservation_view(self.doc, r) for r in sorted(self.doc.reservations.values(), key=lambda r: r.name)]

    def groups(self, component: str | None, state: str | None, gpu: int | None) -> list[dict[str, Any]]:
        out = []
        for g in sorted(self.doc.groups.values(), key=lambda g: g.id):
            if component and component != g.owner and not any(component_of(u) == component for u in g.users):
                continue
            if state and g.state != state:
                continue
            if gpu is not None and not any(d.gpu_index == gpu for d in g.devices):
                continue
            out.append(group_view(self.doc, g))
        return out

    def env(self, caller: Caller, name: str, replica: int) -> dict[str, str]:
        comp = component_or_404(self.doc, name)
        check_owner(caller, comp.owner_uid, f"component {name!r}")
        if not 0 <= replica < comp.replicas:
            raise NotFound(f"{name!r} has replicas 0..{comp.replicas - 1}, not {replica}")
        worker = self.doc.workers.get(replica_ref(name, replica))
        role = worker.role if worker else (Role.SHADOW if comp.shadow_of else Role.PRIMARY)
        return build_env(self.doc, comp, replica, role, self.paths, self.config)

    def owned_component(self, caller: Caller, name: str, replica: int):
        comp = component_or_404(self.doc, name)
        if not caller.is_root and caller.uid != comp.owner_uid:
            raise Forbidden(f"component {name!r} belongs to uid {comp.owner_uid}; its logs are its owner's")
        if not 0 <= replica < max(comp.replicas, 1):
            raise NotFound(f"{name!r} has no replica {replica}")
        return comp

    def logs(self, caller: Caller, name: str, replica: int, stream: str, tail: int | None,
             offset: int | None) -> dict[str, Any]:
        """A replica's log, for its owner or root."""
        comp = self.owned_component(caller, name, replica)
        return read_worker_log(self.paths.log_dir, comp.name, replica, stream, comp.owner_uid, tail, offset)

    def worker_counts(self) -> tuple[int, int]:
        """(workers the state asks for, workers whose process runs now)."""
        doc = self.doc
        keys = (watcher_key(w.component, w.replica) for w in doc.workers.values())
        running = sum(1 for key in keys if self.supervisor.is_running(key))
        return len(doc.workers), running

    def _pids(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for ref, w in self.doc.workers.items():
            live = self.supervisor.pids(watcher_key(w.component, w.replica))
            if live:
                out[ref] = live
            elif w.pid:
                out[ref] = [w.pid]
        return out


def swap_roles(doc: StateDoc, dead_ref: str, partner_ref: str, now: float) -> None:
    """Inside a transaction: the shadow is primary now, the dead primary will come back as its shadow."""
    p = doc.workers[partner_ref]
    doc.workers[partner_ref] = replace(p, role=Role.PRIMARY, promotions=p.promotions + 1, last_promoted_at=now)
    doc.workers[dead_ref] = replace(doc.workers[dead_ref], role=Role.SHADOW, pid=None, create_time=None)
