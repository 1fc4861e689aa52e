"""Decisions about jobs inside a state transaction: queued, ended, finished, forgotten.

Like transactions.py, each function edits the open document and touches no
process. A job's record outlives its processes: once every replica has
ended for good it keeps its exit codes and times, and its groups go back to
the others at once, except those another component still uses.
"""

from __future__ import annotations

from msgspec.structs import replace

from computegroups.daemon.core.keeper import StateKeeper
from computegroups.daemon.core.queue import FINISHED
from computegroups.daemon.core.transactions import (
    Caller,
    check_components_limit,
    check_owner,
    detach_refs,
    remove_component,
)
from computegroups.daemon.core.views import user_name
from computegroups.daemon.core.workers import replica_ref
from computegroups.daemon.model.enums import ComponentState, Outcome, RestartMode
from computegroups.daemon.model.errors import Conflict, LimitReached
from computegroups.daemon.model.requests import ComponentRequest
from computegroups.daemon.supervision.processes import start_time
from computegroups.statefiles.schema import ComponentRecord, StateDoc


def with_default_policy(request: ComponentRequest) -> ComponentRequest:
    """A component allocated with a command is a job unless it says otherwise: restarted only on failure."""
    if request.restart.policy is not None or not request.command:
        return request
    return replace(request, restart=replace(request.restart, policy=RestartMode.ON_FAILURE))


def replace_finished(doc: StateDoc, keeper: StateKeeper, name: str, caller: Caller) -> None:
    """A new component may take the name of a finished one: the old record goes (its owner or root asking)."""
    old = doc.components.get(name)
    if old is None or old.state not in FINISHED:
        return
    check_owner(caller, old.owner_uid, f"finished component {name!r}")
    remove_component(doc, keeper, name, {name})


def enqueue(doc: StateDoc, keeper: StateKeeper, request: ComponentRequest, caller: Caller,
            reason: str) -> ComponentRecord:
    """Queue a claim that does not fit now: a record that holds nothing, with its place and the reason."""
    name = request.name
    if name in doc.components:
        raise Conflict(f"component {name!r} exists: release it first or pick another name")
    check_components_limit(doc, caller, keeper.config.limits.components_per_user)
    check_pending_limit(doc, caller, keeper.config.limits.pending_per_user)
    owner = keeper.path_owner(doc, name)
    if owner is not None:
        raise Conflict(f"{name!r} is a path of deployment {owner!r}, whose groups it names: pick another name")
    client_start = start_time(caller.pid)
    waiter = not request.detach and not request.lease
    comp = ComponentRecord(
        name=name, owner_uid=caller.uid, owner_gid=caller.gid, spec=request.spec(), replicas=request.replicas,
        state=ComponentState.PENDING, lease_pid=caller.pid if request.lease else None,
        lease_start=client_start if request.lease else None, created=keeper.clock(),
        queued_at=keeper.clock(), pending_reason=reason,
        waiter_pid=caller.pid if waiter else None, waiter_start=client_start if waiter else None,
    )
    doc.components[name] = comp
    return comp


def check_pending_limit(doc: StateDoc, caller: Caller, limit: int) -> None:
    """One user may not hold more than `limit` claims in the queue (root may).

    Every queued claim is looked at on each pass of the queue, under the
    lock: one user's thousands would slow every other user's allocations.
    """
    if caller.is_root:
        return
    queued = sum(1 for c in doc.components.values()
                 if c.owner_uid == caller.uid and c.state == ComponentState.PENDING)
    if queued >= limit:
        raise LimitReached(f"{user_name(caller.uid)} has {queued} claims queued, the most one user may have "
                           f"(limits.pending_per_user = {limit}): cancel some or wait for them to start")


def queued_request(comp: ComponentRecord) -> tuple[ComponentRequest, Caller]:
    """The request a queued component was made from, and its owner as the caller it is placed for."""
    request = replace(ComponentRequest.from_spec(comp.name, comp.spec), replicas=comp.replicas,
                      lease=comp.lease_pid is not None)
    return request, Caller(pid=comp.lease_pid or 0, uid=comp.owner_uid, gid=comp.owner_gid)


def end_replica(doc: StateDoc, ref: str, outcome: Outcome, exit_code: int | None, now: float) -> None:
    w = doc.workers.get(ref)
    if w is not None and w.outcome is None:
        doc.workers[ref] = replace(w, pid=None, create_time=None, exit_code=exit_code, ended_at=now,
                                   outcome=outcome)


def finish_if_done(doc: StateDoc, name: str, now: float) -> list[str]:
    """When every replica has ended for good: the component is finished and frees its groups.

    `timeout` if the limit ended any replica, `failed` if any failed,
    `completed` otherwise. Groups another component still uses (a sharer,
    a shadow, one attached to the group) stay until their last user ends.
    Returns the freed groups; none while a replica still runs or will.
    """
    comp = doc.components.get(name)
    workers = [w for w in doc.workers.values() if w.component == name]
    if comp is None or comp.state in FINISHED or not workers or any(w.outcome is None for w in workers):
        return []
    outcomes = {w.outcome for w in workers}
    state = (ComponentState.TIMEOUT if Outcome.TIMEOUT in outcomes else
             ComponentState.FAILED if Outcome.FAILED in outcomes else ComponentState.COMPLETED)
    refs = {replica_ref(name, i) for i in range(comp.replicas)}
    freed = detach_refs(doc, refs, {name})
    for gid, g in list(doc.groups.items()):
        if g.owner == name and not g.users:
            del doc.groups[gid]
            freed.append(gid)
    doc.components[name] = replace(comp, state=state, ended_at=now, lease_pid=None, lease_start=None)
    return freed
