"""Deployments: a set of components applied, scaled and deleted as one.

Every operation is the same reconcile: expand the wanted spec into a plan
(`computegroups.daemon.deployments.plan`), compare it with what the state holds for the
deployment, and change only the difference. The order keeps the manager's
promises:

1. under the manager's lock, decide once in a transaction that is thrown
   away: a claim that does not fit refuses the whole operation before any
   process was touched;
2. without the lock (the deployment and its components marked busy), stop the
   workers that go away or must restart (their env changes), while the state
   still names them;
3. under the lock again, plan again (anything changed meanwhile: restart what
   was stopped and refuse), decide for real and commit: stale groups and
   records go, new groups are placed, users attached, records written;
4. start the new and restarted workers; if one cannot start, the document of
   before the commit is committed again and the stopped workers restart.

The deployment's groups are the ones its stored plan names (same id, same
owner), so nothing another component or deployment holds is ever touched.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from msgspec.structs import replace

from computegroups.daemon.core.keeper import StateKeeper
from computegroups.daemon.core.manager import Manager
from computegroups.daemon.core.queue import FINISHED
from computegroups.daemon.core.transactions import (
    Caller,
    check_attachable,
    check_owner,
    drop_displaced,
    group_record,
)
from computegroups.daemon.deployments.plan import InstancePlan, Plan, expand, sibling_claim
from computegroups.daemon.deployments.views import deployment_summary, deployment_tree
from computegroups.daemon.model.claims import Claim
from computegroups.daemon.model.deployment import (
    DeploymentError,
    DeploymentSpec,
    check_immutable,
    parse,
)
from computegroups.daemon.model.enums import ComponentState, GroupState, Role, Scope
from computegroups.daemon.model.errors import BadRequest, Conflict, NotFound
from computegroups.daemon.model.refs import ReplicaRef, component_of
from computegroups.daemon.model.requests import ComponentSpec, check_env
from computegroups.statefiles.schema import ComponentRecord, DeploymentRecord, StateDoc, WorkerRecord

log = logging.getLogger("cgd.deployments")


class _Trial(Exception):
    """Raised to throw away a transaction whose decisions were only a check."""


@dataclass
class _Diff:
    """What one reconcile changes, decided before anything is touched."""

    name: str
    plan: Plan
    spec: DeploymentSpec | None
    owner: tuple[int, int]
    source: str | None
    stale_groups: list[str] = field(default_factory=list)
    new_groups: list[str] = field(default_factory=list)
    kept_groups: list[str] = field(default_factory=list)
    foreign_users: dict[str, tuple[str, ...]] = field(default_factory=dict)
    gone_components: list[str] = field(default_factory=list)
    new_components: list[str] = field(default_factory=list)
    drop_workers: list[str] = field(default_factory=list)
    new_workers: list[str] = field(default_factory=list)
    restart: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    """Components that ended for good (jobs) and did not change: left as they are, their groups
    not placed again, their workers not started again."""

    @property
    def stop(self) -> list[str]:
        return sorted(set(self.drop_workers) | set(self.restart))

    @property
    def start(self) -> list[str]:
        return sorted(set(self.new_workers) | set(self.restart))

    def changes(self) -> dict[str, list[str]]:
        return {
            "groups_created": self.new_groups, "groups_deleted": self.stale_groups,
            "components_created": self.new_components, "components_deleted": self.gone_components,
            "workers_started": self.start, "workers_stopped": self.stop,
        }


@dataclass(frozen=True)
class _Change:
    """A deployment's stored spec, the wanted one (None to delete), and who owns it."""

    old: DeploymentSpec | None
    new: DeploymentSpec | None
    owner: tuple[int, int]
    source: str | None


class Deployments:
    """The deployment operations of the API; state is written only through the manager's keeper."""

    def __init__(self, manager: Manager) -> None:
        self.manager = manager
        self.keeper = manager.keeper
        self.keeper.path_owner = deployment_using
        self._busy: set[str] = set()

    async def apply(self, caller: Caller, data: Any, source: str | None,
                    included: dict[str, Any] | None = None) -> dict[str, Any]:
        """Create the deployment, or bring it to a new version of its file (and of the files it includes)."""
        spec = _checked(lambda: parse(data, source, included))
        created = False

        def decide() -> _Change:
            nonlocal created
            record = self.keeper.doc.deployments.get(spec.name)
            created = record is None
            if record is None:
                return _Change(None, spec, (caller.uid, caller.gid), source)
            check_owner(caller, record.owner_uid, f"deployment {spec.name!r}")
            old = DeploymentSpec.from_dict(record.spec)
            try:
                check_immutable(old, spec, source)
            except DeploymentError as exc:
                raise Conflict(str(exc)) from None
            return _Change(old, spec.carry_sizes(old), (record.owner_uid, record.owner_gid), source)

        for i, c in enumerate(spec.components):
            if c.cwd is not None and not os.path.isdir(c.cwd):
                raise BadRequest(f"{source or spec.name}: components[{i}].cwd: {c.cwd} is not a directory")
        changes = await self._reconcile(spec.name, decide)
        return {**self.tree(spec.name), "changes": {"created": created, **changes}}

    async def scale(self, caller: Caller, name: str, target: str | None, replicas: int) -> dict[str, Any]:
        """Scale the set (`target` None), a scaling group or a component in every set replica."""

        def decide() -> _Change:
            record = self._record(name)
            check_owner(caller, record.owner_uid, f"deployment {name!r}")
            old = DeploymentSpec.from_dict(record.spec)
            try:
                new = old.scaled(target, replicas)
            except LookupError:
                raise NotFound(f"deployment {name!r} has no scaling group or component {target!r}: "
                               f"`cgctl get {name}` shows them") from None
            except DeploymentError as exc:
                raise BadRequest(str(exc)) from None
            return _Change(old, new, (record.owner_uid, record.owner_gid), record.source)

        changes = await self._reconcile(name, decide)
        return {**self.tree(name), "changes": {"created": False, **changes}}

    async def delete(self, caller: Caller, name: str) -> dict[str, Any]:
        """Remove every component, worker and group the deployment made, and nothing else."""

        def decide() -> _Change:
            record = self._record(name)
            check_owner(caller, record.owner_uid, f"deployment {name!r}")
            old = DeploymentSpec.from_dict(record.spec)
            return _Change(old, None, (record.owner_uid, record.owner_gid), record.source)

        changes = await self._reconcile(name, decide)
        return {"deleted": name, "components": changes["components_deleted"],
                "groups": changes["groups_deleted"], "workers": changes["workers_stopped"]}

    def tree(self, name: str) -> dict[str, Any]:
        record = self._record(name)
        plan = expand(DeploymentSpec.from_dict(record.spec))
        pids: dict[str, list[int]] = {}
        for pid, ref in self.manager.worker_pids_and_shares()[0].items():
            pids.setdefault(ref, []).append(pid)
        return deployment_tree(self.keeper.doc, record, plan, {r: sorted(p) for r, p in pids.items()},
                               self.keeper.config.device_naming, self.manager.replica_states, self.manager.binding)

    def summaries(self) -> list[dict[str, Any]]:
        doc = self.keeper.doc
        return [deployment_summary(doc, r, expand(DeploymentSpec.from_dict(r.spec)))
                for r in sorted(doc.deployments.values(), key=lambda r: r.name)]

    def _record(self, name: str) -> DeploymentRecord:
        record = self.keeper.doc.deployments.get(name)
        if record is None:
            raise NotFound(f"no deployment named {name!r}: `cgctl get` lists them")
        return record

    # -- the reconcile ---------------------------------------------------------

    async def _reconcile(self, name: str, decide: Callable[[], _Change]) -> dict[str, list[str]]:
        """Plan under the lock, stop workers outside it, then commit under it again.

        Stopping can take the workers' whole grace period, so the lock is let
        go meanwhile: the deployment and its components are marked busy, and
        the plan is made again before the commit. If anything it depends on
        changed, the stopped workers are started again and nothing changes.
        """
        async with self.keeper.lock:
            if name in self._busy:
                raise Conflict(f"deployment {name!r} is being changed: try again once that is done")
            change = decide()
            diff = self._plan(name, change)
            members = sorted(set(diff.gone_components) | set(diff.plan.instances)
                             | {n for n, c in self.keeper.doc.components.items() if c.deployment == name})
            self.manager.check_idle(*members)
            if not diff.stop:
                before = self.keeper.doc
                self._commit(diff)
                await self.manager.start_or_undo(diff.start, before, f"the workers of deployment {name!r}")
                return diff.changes()
            self.manager.mark_busy(members, f"being changed by deployment {name!r}")
            self._busy.add(name)
        try:
            await self.manager.stop_workers(diff.stop)
            async with self.keeper.lock:
                before = self.keeper.doc
                try:
                    again = self._plan(name, change)
                    if (again.changes(), again.foreign_users) != (diff.changes(), diff.foreign_users):
                        raise Conflict(f"deployment {name!r}: its groups changed while its workers stopped; "
                                       "nothing was changed, apply again")
                    self._commit(diff)
                    await self.manager.start_or_undo(diff.start, before, f"the workers of deployment {name!r}")
                except BaseException:
                    await self.manager.start_workers([r for r in diff.stop if r in self.keeper.doc.workers])
                    raise
                return diff.changes()
        finally:
            self._busy.discard(name)
            self.manager.clear_busy(members)

    def _plan(self, name: str, change: _Change) -> _Diff:
        """The difference to make, checked in a transaction that is thrown away."""
        old_plan = expand(change.old) if change.old is not None else Plan(name)
        new = change.new
        plan = _checked(lambda: expand(new), change.source) if new is not None else Plan(name)
        doc = self.keeper.doc
        held = {gid for gid, g in old_plan.groups.items() if gid in doc.groups and doc.groups[gid].owner == g.owner}
        mine = {n for n, c in doc.components.items() if c.deployment == name}
        if change.new is not None:
            _check_env(change.new, change.owner[0], change.source)
            _check_free(doc, name, plan, mine, held)
        diff = _diff(doc, name, plan, change.new, change.owner, change.source, mine, held)
        for gid in diff.kept_groups:  # before any worker stops: a drained group takes no new user
            check_attachable(doc.groups[gid], _kept_users(diff, gid))
        if diff.new_groups:
            assert diff.spec is not None, "only a deployment that stays gets new groups"
            lowest = min((diff.spec.claim(plan.groups[gid].claim) for gid in diff.new_groups),
                         key=lambda claim: claim.priority)
            try:
                with self.keeper.transaction() as trial:
                    self.manager.check_queue(trial, lowest)  # services: no time limit, never backfilled
                    _decide(trial, self.keeper, diff)
                    raise _Trial
            except _Trial:
                pass
        return diff

    def _commit(self, diff: _Diff) -> None:
        with self.keeper.transaction() as txn:
            _decide(txn, self.keeper, diff)
        for name in diff.new_components:  # a time limit counts from the instance's creation
            self.manager.arm_time_limit(name)
        if diff.new_groups:
            self.manager.queue_soon()  # less is free now: the queued claims' reasons are told again
        if diff.stale_groups or diff.new_groups:
            log.info("deployment %s: %d groups created, %d deleted", diff.name, len(diff.new_groups),
                     len(diff.stale_groups))


def deployment_using(doc: StateDoc, name: str) -> str | None:
    """The deployment whose plan names `name` (a set, scaling group or component path), if any."""
    for record in doc.deployments.values():
        if name in expand(DeploymentSpec.from_dict(record.spec)).owners:
            return record.name
    return None


def _checked(decide: Callable[[], Any], source: str | None = None) -> Any:
    try:
        return decide()
    except DeploymentError as exc:
        raise BadRequest(str(exc.within(source) if source and not exc.source else exc)) from None


def _check_env(spec: DeploymentSpec, owner_uid: int, source: str | None) -> None:
    """The model's rule for a worker's environment, for the user the workers run as (the deployment's
    owner): refused here, before anything is placed, rather than when a worker starts."""
    for i, c in enumerate(spec.components):
        try:
            check_env(c.env, as_root=owner_uid == 0)
        except ValueError as exc:
            raise BadRequest(f"{source or spec.name}: components[{i}].{exc}") from None


def _check_free(doc: StateDoc, name: str, plan: Plan, mine: set[str], held: set[str]) -> None:
    """Every name the plan generates is free or already this deployment's."""
    taken = {n for n, c in doc.components.items() if c.deployment != name} | set(doc.reservations)
    for path, inst in plan.instances.items():
        if path in taken:
            raise Conflict(f"{inst.describe()}: component {path!r} exists outside deployment {name!r}: "
                           "release it or rename")
    for owner in sorted(plan.owners - set(plan.instances)):
        if owner in taken:
            raise Conflict(f"deployment {name!r}: {owner!r} names a component or reservation outside the "
                           "deployment, whose groups would mix with its own: release it or rename")
    for other in doc.deployments.values():
        if other.name == name:
            continue
        clash = sorted(plan.owners & expand(DeploymentSpec.from_dict(other.spec)).owners)
        if clash:
            raise Conflict(f"deployment {name!r}: {clash[0]!r} is also a path of deployment {other.name!r}")
    for gid, g in plan.groups.items():
        if gid in doc.groups and gid not in held:
            raise Conflict(f"{g.describe()}: group {gid!r} exists, owned by {doc.groups[gid].owner!r}, "
                           "outside the deployment")


def _diff(doc: StateDoc, name: str, plan: Plan, spec: DeploymentSpec | None, owner: tuple[int, int],
          source: str | None, mine: set[str], held: set[str]) -> _Diff:
    diff = _Diff(name, plan, spec, owner, source)
    ours = mine | set(plan.instances)
    for gid in sorted(held):
        foreign = tuple(u for u in doc.groups[gid].users if component_of(u) not in ours)
        if foreign and gid not in plan.groups:
            raise Conflict(f"group {gid!r} of deployment {name!r} is also used by {foreign[0]!r}: "
                           "release that first")
        if foreign:
            diff.foreign_users[gid] = foreign
    for c in doc.components.values():
        attached = c.shadow_of or c.spec.share_with
        if c.name not in ours and attached in mine - set(plan.instances):
            raise Conflict(f"component {c.name!r} is attached to {attached!r} of deployment {name!r}: "
                           "release it first")
    changed = {path for path in mine & set(plan.instances)
               if (doc.components[path].spec, doc.components[path].shadow_of)
               != (_instance_spec(plan.instances[path]), plan.instances[path].shadow_of)}
    finished = {path for path in mine & set(plan.instances) - changed if doc.components[path].state in FINISHED}
    diff.finished = sorted(finished)
    idle = {gid for gid, g in plan.groups.items() if g.users and all(component_of(u) in finished for u in g.users)}
    diff.stale_groups = sorted(held - set(plan.groups))
    diff.new_groups = sorted(set(plan.groups) - held - idle)
    diff.kept_groups = sorted(held & set(plan.groups))
    diff.gone_components = sorted(mine - set(plan.instances))
    diff.new_components = sorted(set(plan.instances) - mine)
    wanted = {ref: inst for ref, inst in plan.refs().items()
              if inst.component.command is not None and inst.path not in finished}
    current = {ref for ref, w in doc.workers.items() if w.component in mine and w.component not in finished}
    wanted_groups = plan.groups_of()
    diff.drop_workers = sorted(current - set(wanted))
    diff.new_workers = sorted(set(wanted) - current)
    using: dict[str, list[str]] = {}
    for gid in sorted(doc.groups):
        for ref in doc.groups[gid].users:
            using.setdefault(ref, []).append(gid)
    diff.restart = sorted(ref for ref in current & set(wanted)
                          if wanted[ref].path in changed or list(wanted_groups[ref]) != using.get(ref, []))
    return diff


def _live(users: tuple[str, ...], diff: _Diff) -> tuple[str, ...]:
    """A group's users but the replicas of finished components: an ended job holds no group."""
    return tuple(u for u in users if component_of(u) not in diff.finished)


def _instance_spec(inst: InstancePlan) -> ComponentSpec:
    """The component record's spec: what the worker runs (its count lives on the record)."""
    return inst.component.request(inst.path, inst.shadow_of).spec()


def _batches(diff: _Diff) -> list[tuple[tuple[str, Claim], list[str]]]:
    """The new groups in the batches they are placed in, all or nothing: one per sharing entry,
    owner and claim (a claim's affinity to a sibling resolves per set replica), a batch whose
    affinity names a component of another batch placed after it, so the sibling is already there
    (a leader before its workers)."""
    assert diff.spec is not None or not diff.new_groups, "only a deployment that stays gets new groups"
    batches: dict[tuple[str, str, Claim], list[str]] = {}
    spec = diff.spec
    for gid in diff.new_groups:
        assert spec is not None
        g = diff.plan.groups[gid]
        try:
            claim = sibling_claim(spec, g, spec.claim(g.claim))
        except DeploymentError as exc:
            raise BadRequest(str(exc.within(diff.source) if diff.source and not exc.source else exc)) from None
        batches.setdefault((g.origin, g.owner, claim), []).append(gid)
    users = {key: {component_of(u) for gid in ids for u in diff.plan.groups[gid].users}
             for key, ids in batches.items()}
    ordered: list[tuple[tuple[str, Claim], list[str]]] = []
    done: set[tuple[str, str, Claim]] = set()

    def visit(key: tuple[str, str, Claim]) -> None:
        """Place a batch after the batches its affinity names: depth first, so each leader is
        followed by its own workers before the next set replica's leader takes a GPU."""
        if key in done:
            return
        done.add(key)  # before the dependencies: a cycle of affinities is placed in file order
        wanted = {t.component for t in key[2].affinity}
        for other in batches:
            if other != key and wanted & users[other]:
                visit(other)
        ordered.append(((key[1], key[2]), batches[key]))

    for key in batches:
        visit(key)
    return ordered


def _kept_users(diff: _Diff, gid: str) -> tuple[str, ...]:
    """Who uses a group the change keeps: the plan's live users and the sharers from outside."""
    return tuple(sorted(set(_live(diff.plan.groups[gid].users, diff)) | set(diff.foreign_users.get(gid, ()))))


def _decide(doc: StateDoc, keeper: StateKeeper, diff: _Diff) -> None:
    """The whole change, inside one open transaction; raises (and so changes
    nothing) when a new group does not fit."""
    now = keeper.clock()
    plan = diff.plan
    owner_uid, owner_gid = diff.owner
    for ref in diff.drop_workers:
        del doc.workers[ref]
    for gid in diff.stale_groups:
        del doc.groups[gid]
    for gid in diff.kept_groups:
        users = _kept_users(diff, gid)
        check_attachable(doc.groups[gid], users)
        if users != doc.groups[gid].users:
            doc.groups[gid] = replace(doc.groups[gid], users=users)
    for (owner, claim), ids in _batches(diff):
        placements = keeper.place(doc, claim, ids, owner)
        drop_displaced(doc, placements)
        for p in placements:
            g = plan.groups[p.group_id]
            doc.groups[g.id] = group_record(
                keeper.machine, p, claim, owner=g.owner, owner_uid=owner_uid, owner_gid=owner_gid,
                users=_live(g.users, diff), scope=Scope(g.scope), replica=g.replica, state=GroupState.ALLOCATED,
                created=now,
            )
    for path in diff.gone_components:
        del doc.components[path]
    for path, inst in plan.instances.items():
        spec = _instance_spec(inst)
        current = doc.components.get(path)
        if current is not None and (current.spec, current.shadow_of) == (spec, inst.shadow_of):
            if current.replicas != inst.replicas:
                doc.components[path] = replace(current, replicas=inst.replicas)
            continue
        doc.components[path] = ComponentRecord(
            name=path, owner_uid=owner_uid, owner_gid=owner_gid, spec=spec, replicas=inst.replicas,
            state=ComponentState.RUNNING if inst.component.command else ComponentState.ALLOCATED, deployment=diff.name,
            shadow_of=inst.shadow_of, created=current.created if current else now,
        )
    for ref in diff.restart:
        w = doc.workers[ref]
        if w.outcome is not None:  # a job that ended and changed since: it runs anew
            doc.workers[ref] = replace(w, pid=None, create_time=None, outcome=None, exit_code=None, ended_at=None,
                                       restarts=0, started_at=now)
    refs = plan.refs()
    for ref in diff.new_workers:
        inst = refs[ref]
        doc.workers[ref] = WorkerRecord(
            component=inst.path, replica=ReplicaRef.parse(ref).replica,
            role=Role.SHADOW if inst.shadow_of else Role.PRIMARY, pid=None, create_time=None, started_at=now,
        )
    if diff.spec is None:
        doc.deployments.pop(diff.name, None)
    else:
        doc.deployments[diff.name] = DeploymentRecord(
            name=diff.name, owner_uid=owner_uid, owner_gid=owner_gid, spec=diff.spec.to_dict(),
            source=diff.source,
        )
