"""Component operations: allocate, release, scale, restart and freeing one group (which may scale
or release its component), each one transaction then its processes.

A part of `Manager` (see manager.py): every method runs on the manager's
state keeper and supervisor, and decides under its lock.
"""

from __future__ import annotations

import time
from typing import Any

from msgspec.structs import replace

from computegroups.daemon.core.base import log
from computegroups.daemon.core.groups import Groups
from computegroups.daemon.core.jobstate import enqueue, queued_request, replace_finished, with_default_policy
from computegroups.daemon.core.queue import FINISHED
from computegroups.daemon.core.transactions import (
    Caller,
    check_owner,
    check_scale_in,
    component_or_404,
    dependents,
    new_component_records,
    remove_component,
    scale_component,
)
from computegroups.daemon.core.views import group_deployment
from computegroups.daemon.core.workers import (
    replica_ref,
    watcher_key,
)
from computegroups.daemon.model.enums import ComponentState, Scope
from computegroups.daemon.model.errors import BadRequest, Conflict, InsufficientCapacity, NotFound, Unsatisfiable
from computegroups.daemon.model.requests import ComponentRequest, check_env
from computegroups.daemon.model.words import plural
from computegroups.daemon.supervision.asuser import start_problem
from computegroups.daemon.supervision.processes import start_time
from computegroups.daemon.supervision.workerenv import owner_env
from computegroups.statefiles.schema import ComponentRecord


class Components(Groups):
    async def allocate(self, caller: Caller, request: ComponentRequest) -> dict[str, Any]:
        try:
            check_env(request.env, as_root=caller.is_root)  # the workers run as the caller
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        if request.command or request.cwd is not None:
            try:
                owner = owner_env(caller.uid, caller.gid)
            except ValueError as exc:
                raise BadRequest(f"cannot run workers for the caller: {exc}") from None
            argv = (("/bin/sh",) if request.shell else request.command) or ()
            path = request.env.get("PATH", owner.path)
            problem = start_problem(caller.uid, caller.gid, argv, path, request.cwd or owner.home)
            if problem is not None:
                raise BadRequest(problem)
        request = with_default_policy(request)
        async with self.keeper.lock:
            self.check_idle(request.name)
            self.check_groups_idle(request.shadow_of or request.share_with)
            before = self.doc
            started = time.perf_counter()
            try:
                with self.keeper.transaction() as doc:
                    replace_finished(doc, self.keeper, request.name, caller)
                    if request.name not in doc.reservations:  # a reservation holds its capacity already
                        self.check_queue(doc, request.claim, request.time_limit_s)
                    comp = new_component_records(doc, self.keeper, request, caller)
                    if request.lease:
                        doc.components[comp.name] = replace(comp, lease_start=start_time(caller.pid))
                granted = self.keeper.claims_placed  # none for a shadow or sharer: it attaches, places nothing
            except InsufficientCapacity as exc:
                if not request.wait:
                    self.refused(caller, request.name, exc)
                    raise
                with self.keeper.transaction() as doc:
                    replace_finished(doc, self.keeper, request.name, caller)
                    enqueue(doc, self.keeper, request, caller, str(exc))
                log.info("queued %s: %s", request.name, exc)
                return self.component(request.name)
            except Unsatisfiable as exc:
                self.refused(caller, request.name, exc)
                raise
            await self.keeper.durable()
            if granted:
                self.keeper.instruments.allocation_commit_seconds.observe(time.perf_counter() - started)
            refs = sorted(ref for ref, w in self.doc.workers.items() if w.component == request.name)
            await self.start_or_undo(refs, before, f"the workers of {request.name!r}")
            self.arm_time_limit(request.name)
            self.queue_soon()  # less is free now: the queued claims' reasons are told again
            return self.component(request.name)

    def refused(self, caller: Caller, name: str, why: Exception) -> None:
        """Tell of a claim that does not fit (now, or on this machine at all): nothing was changed."""
        self.keeper.events.emit("refused", f"{name} refused: {why}", uid=caller.uid, component=name,
                                reason=str(why))

    async def release(self, caller: Caller, name: str, stop_timeout: float | None = None, *,
                      only_from: int | None = None) -> dict[str, Any]:
        """`stop_timeout` overrides the component's own grace before its workers are killed;
        `only_from` refuses unless the component still has that many replicas (see `scale`)."""
        async with self.keeper.lock:
            self._check_release(caller, name, only_from)
            closure, refs = self._begin_release([name])
        return await self._finish_release(closure, refs, stop_timeout)

    async def release_many(self, caller: Caller, names: list[str],
                           stop_timeout: float | None = None) -> dict[str, Any]:
        """Components and reservations by name, as `cgctl release` takes either. Every name is checked
        under one hold of the lock before anything changes: one that can not go (unknown, another's, a
        deployment's, shared by a component not named) leaves all the others as they were."""
        if not names:
            raise BadRequest("name at least one component or reservation to release")
        wanted = list(dict.fromkeys(names))
        async with self.keeper.lock:
            held: list[str] = []
            for name in wanted:
                if name in self.doc.components:
                    self._check_release(caller, name)
                elif name in self.doc.reservations:
                    check_owner(caller, self.doc.reservations[name].owner_uid, f"reservation {name!r}")
                    held.append(name)
                else:
                    raise NotFound(f"no component or reservation named {name!r}: nothing released "
                                   "(`cgctl list` shows what exists)")
            closure, refs = self._begin_release([n for n in wanted if n not in held])  # checks the sharers
            reserved = [g for name in held for g in self.unreserve_locked(caller, name)["groups"]]
        done = await self._finish_release(closure, refs, stop_timeout) if closure else {"released": [], "groups": []}
        return {**done, "groups": sorted([*done["groups"], *reserved]), "reservations": held}

    def _check_release(self, caller: Caller, name: str, only_from: int | None = None) -> None:
        self.check_idle(name)
        comp = self.doc.components.get(name)
        if comp is None or comp.state != "releasing":  # a release whose stop failed may be retried
            comp = component_or_404(self.doc, name)
        check_owner(caller, comp.owner_uid, f"component {name!r}")
        _check_unchanged(comp, only_from)
        if comp.deployment:
            raise BadRequest(f"{name!r} belongs to deployment {comp.deployment!r}: delete or scale it there")

    async def release_all(self, caller: Caller) -> dict[str, Any]:
        async with self.keeper.lock:
            mine = [c.name for c in self.doc.components.values()
                    if c.owner_uid == caller.uid and c.state != "releasing" and not c.deployment
                    and c.name not in self._busy]
            closure, refs = self._begin_release(mine)
        return await self._finish_release(closure, refs)

    async def scale(self, caller: Caller, name: str, replicas: int, *, only_from: int | None = None) -> dict[str, Any]:
        """`only_from`: refuse unless the component still has that many replicas (a decision made
        before the lock was taken again, as `deallocate_group`'s, must not scale the wrong way)."""
        async with self.keeper.lock:
            comp = component_or_404(self.doc, name)
            check_owner(caller, comp.owner_uid, f"component {name!r}")
            _check_unchanged(comp, only_from)
            if comp.shadow_of:
                raise BadRequest(f"{name!r} is a shadow of {comp.shadow_of!r}: scale the primary")
            if comp.deployment:
                raise BadRequest(f"{name!r} belongs to deployment {comp.deployment!r}: scale it there")
            if comp.state == "releasing":
                raise Conflict(f"component {name!r} is being released")
            if comp.state in FINISHED or comp.state == ComponentState.PENDING:
                raise Conflict(f"component {name!r} is {comp.state}: only a placed component can be scaled")
            shadows, _ = dependents(self.doc, name)
            members = (name, *shadows)
            self.check_idle(*members)
            self.check_groups_idle(comp.spec.share_with)
            old = comp.replicas
            if replicas >= old:
                before = self.doc
                with self.keeper.transaction() as doc:
                    if replicas > old and not comp.spec.share_with and comp.spec.scope == Scope.PER_REPLICA:
                        self.check_queue(doc, comp.spec.claim, self._time_left(comp))  # new groups
                    scale_component(doc, self.keeper, doc.components[name], replicas)
                fresh = [replica_ref(n, i) for n in members for i in range(old, replicas)]
                await self.start_or_undo([r for r in fresh if r in self.doc.workers], before,
                                          f"the new replicas of {name!r}")
                self.queue_soon()
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

    async def deallocate_group(self, caller: Caller, gid: str) -> dict[str, Any]:
        """Free one group where that means something, and say what it took.

        A group made on its own is deleted (refused while in use); a
        reservation's goes with its reservation; a component's per-replica
        group goes with its replica, which is a scale-in by one when it is the
        last replica (replicas are numbered, so a middle one cannot go alone)
        or the component's release when it is the only one; an all-replicas
        group is what every replica runs on, so the component is released. A
        deployment's group is the deployment's to change.

        A deletion and a reservation's release stop no process: they are done
        under the lock the decision was made under, so nothing that came
        between (the group deleted and another made with its id) is acted on.
        A scale-in or a release stops workers outside the lock, and checks
        with `only_from` that the component is still as it was seen.
        """
        async with self.keeper.lock:
            g = self.group_record(gid)
            check_owner(caller, g.owner_uid, f"group {gid!r}")
            deployment = group_deployment(self.doc, g)
            if deployment is not None:
                raise BadRequest(f"group {gid!r} belongs to deployment {deployment!r}: change the deployment "
                                 f"(`cgctl scale`, `cgctl apply`, `cgctl delete {deployment}`)")
            comp = self.doc.components.get(g.owner)
            if g.standalone:
                done = self.delete_group_locked(caller, gid)
                return {"deallocated": gid, "action": "deleted", "owner": g.owner, "result": done}
            if g.owner in self.doc.reservations:
                done = self.unreserve_locked(caller, g.owner)
                return {"deallocated": gid, "action": "reservation released", "owner": g.owner, "result": done}
            if comp is None:
                raise Conflict(f"group {gid!r} belongs to {g.owner!r}, which is being released")
            elif g.scope == Scope.PER_REPLICA and g.replica is not None and comp.replicas > 1:
                last = comp.replicas - 1
                if g.replica != last:
                    raise Conflict(
                        f"group {gid!r} is replica {g.replica} of {comp.replicas} of {comp.name!r}: replicas "
                        f"are numbered, so only the last one ({comp.name}/{last}) can go alone; "
                        f"scale {comp.name!r} to {g.replica} or release it")
                action, replicas = "scaled in", last
            else:
                action, replicas = "component released", None
            count = comp.replicas
        if replicas is not None:
            done = await self.scale(caller, g.owner, replicas, only_from=replicas + 1)
        else:
            done = await self.release(caller, g.owner, only_from=count)
        return {"deallocated": gid, "action": action, "owner": g.owner, "result": done}

    async def restart(self, caller: Caller, name: str, replica: int | None) -> dict[str, Any]:
        """Stop and start a component's workers (one replica, or all) with the same groups and role.

        The way back for a replica that used up its restarts (`failed`), or
        for a worker that should reread its files. Its shadow is not promoted:
        this is not a death. A component that has ended for good gave its
        groups back: it is placed again, as it was asked for, and runs anew.
        """
        async with self.keeper.lock:
            comp = component_or_404(self.doc, name)
            check_owner(caller, comp.owner_uid, f"component {name!r}")
            if not comp.spec.command:
                raise BadRequest(f"{name!r} runs no command: there is nothing to restart")
            if comp.state == "lost":
                raise Conflict(f"component {name!r} is lost: its GPUs are gone; release it")
            if comp.state == ComponentState.PENDING:
                raise Conflict(f"component {name!r} is queued: it has not started yet")
            if replica is not None and not 0 <= replica < comp.replicas:
                raise NotFound(f"{name!r} has replicas 0..{comp.replicas - 1}, not {replica}")
            if comp.state in FINISHED:
                return await self._rerun(comp)
            self.mark_busy([name], "being restarted")
            indices = range(comp.replicas) if replica is None else [replica]
            refs = [r for r in (replica_ref(name, i) for i in indices) if r in self.doc.workers]
        try:
            await self.stop_workers(refs)
            async with self.keeper.lock:
                with self.keeper.transaction() as doc:
                    for ref in refs:
                        doc.workers[ref] = replace(doc.workers[ref], pid=None, create_time=None, outcome=None,
                                                   exit_code=None, ended_at=None)
                try:
                    await self.start_workers(refs)
                except Exception as exc:
                    self._mark_failed(name, refs)
                    raise BadRequest(f"could not start the workers of {name!r} again: {exc}") from None
                log.info("restarted %s at the request of uid %d", ", ".join(refs), caller.uid)
                return self.component(name)
        finally:
            self.clear_busy([name])

    async def _rerun(self, comp: ComponentRecord) -> dict[str, Any]:
        """Under the lock: place an ended component again from its own request, and start it."""
        request, owner = queued_request(comp)
        before = self.doc
        with self.keeper.transaction() as doc:
            remove_component(doc, self.keeper, comp.name, {comp.name})
            self.check_queue(doc, request.claim, request.time_limit_s)
            created = new_component_records(doc, self.keeper, request, owner)
            doc.components[comp.name] = replace(created, lease_pid=comp.lease_pid, lease_start=comp.lease_start)
        refs = sorted(ref for ref, w in self.doc.workers.items() if w.component == comp.name)
        await self.start_or_undo(refs, before, f"the workers of {comp.name!r}")
        self.arm_time_limit(comp.name)
        self.queue_soon()
        log.info("%s placed and started again", comp.name)
        return self.component(comp.name)

    def _time_left(self, comp: ComponentRecord) -> float | None:
        """How long the component may still run by its time limit; None without one."""
        limit = comp.spec.time_limit_s
        return None if limit is None else max(0.0, comp.created + limit - self.keeper.clock())

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


def _check_unchanged(comp: ComponentRecord, only_from: int | None) -> None:
    """A decision made before the lock was taken again must not act on a component scaled since."""
    if only_from is not None and comp.replicas != only_from:
        raise Conflict(f"component {comp.name!r} changed meanwhile ({plural(comp.replicas, 'replica')} now): "
                       "ask again")
