"""The decisions inside a state transaction, kept apart from processes.

Each function here runs inside `StateKeeper.transaction()` (keeper.py, which
commits, tells and keeps the ledger): it reads the document, asks the
allocator, and edits the document. The manager calls them
under its lock and acts on processes only after the write is durable. A
failed decision leaves both the state file and the allocator as they were.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec
from msgspec.structs import replace

from computegroups.daemon.core.keeper import StateKeeper
from computegroups.daemon.core.views import user_name
from computegroups.daemon.core.workers import replica_groups, replica_ref
from computegroups.daemon.model.claims import Claim
from computegroups.daemon.model.enums import ComponentState, GroupState, Role, Scope
from computegroups.daemon.model.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    LimitReached,
    NotFound,
)
from computegroups.daemon.model.refs import component_of, uses
from computegroups.daemon.model.requests import ComponentRequest, ReservationRequest
from computegroups.daemon.model.words import plural
from computegroups.daemon.placement.allocator import Placement
from computegroups.statefiles.schema import (
    ComponentRecord,
    DeviceRecord,
    GroupRecord,
    ReservationRecord,
    StateDoc,
    WorkerRecord,
)
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


def attachable_group(doc: StateDoc, caller: Caller, gid: str) -> GroupRecord:
    """The group a component may attach to by id (`group`), or the refusal that says why not."""
    g = doc.groups.get(gid)
    if g is None:
        raise NotFound(f"no group {gid!r}: `cgctl group list` shows what exists")
    check_owner(caller, g.owner_uid, f"group {gid!r}")
    if not g.standalone:
        raise BadRequest(f"group {gid!r} belongs to {g.owner!r}: attach with share_with {g.owner!r} instead")
    if g.state not in (GroupState.ALLOCATED, GroupState.DRAINING, GroupState.DEGRADED):
        raise Conflict(f"group {gid!r} is {g.state}: nothing new may attach to it")
    return g  # a draining one is refused by `check_attachable`, naming who and how to undrain


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
        owner_stays = g.standalone or (g.owner in doc.components and g.owner not in releasing)
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
                        f"replicas: {target_name!r} has {plural(target.replicas, 'replica')}; "
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
            if not request.command:
                raise BadRequest("claim: a component with no claim, no command and no group to attach to "
                                 "holds and runs nothing: give a claim (cpus) or a command")
            # Nothing else to claim on a machine without GPUs: the process runs on at least one CPU.
            request = msgspec.structs.replace(request, claim=Claim(cpus=1))
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
                f"{plural(dep.replicas, 'replica')}: scale it down first"
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
                        raise BadRequest(f"replicas: {target.name!r} has only "
                                         f"{plural(target.replicas, 'replica')} to share")
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
