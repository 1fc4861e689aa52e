"""The events a commit makes: what changed between two documents, in people's words.

Pure: two documents and the keys a transaction touched in, a list of
events out. Deriving them from the commit rather than from each operation
means every path that changes the state (a request, a deployment, the
queue, recovery, the health loop) tells the same story, and an event is
never told for a change that was not written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from computegroups.daemon.model.enums import ComponentState
from computegroups.statefiles.schema import ComponentRecord, GroupRecord, ReservationRecord, StateDoc, WorkerRecord

ENDED = {ComponentState.COMPLETED: "completed", ComponentState.FAILED: "failed", ComponentState.TIMEOUT: "failed"}


@dataclass(frozen=True)
class Change:
    """One event before it is numbered: its type, whose it is (uid; None: the machine's), what."""

    type: str
    message: str
    uid: int | None
    what: dict[str, Any] = field(default_factory=dict)


WorkerPid = Callable[[str, int, int], int | None]
"""(component, replica, launch shim's pid) -> the worker's own pid, when it is known."""


def touched(before: Mapping[str, Any], after: Mapping[str, Any]) -> Iterable[str]:
    """The keys a commit may have changed: those the transaction's map remembers, else all."""
    keys = getattr(after, "touched", None)
    return sorted(keys) if keys is not None else sorted(before.keys() | after.keys())


def state_changes(before: StateDoc, after: StateDoc, component_keys: Iterable[str],
                  worker_keys: Iterable[str], group_keys: Iterable[str],
                  gpu_index: Mapping[str, int],
                  worker_pid: WorkerPid = lambda component, replica, shim: None,
                  reservation_keys: Iterable[str] = (), now: float = 0.0) -> list[Change]:
    """The events of one commit; `gpu_index` names GPUs by index for the drained ones, and
    `worker_pid` a started worker by its own pid (the state records its launch shim's). `now`, the
    commit's time, tells a reservation that expired from one released."""
    out: list[Change] = []
    group_keys = list(group_keys)
    gpus = _gpus_by_component(after, group_keys)
    cpus = _cpus_by_component(after, group_keys)
    for name in component_keys:
        out += _component(before.components.get(name), after.components.get(name), gpus.get(name, set()),
                          cpus.get(name, 0))
    for ref in worker_keys:
        out += _worker(before.workers.get(ref), after.workers.get(ref), after, worker_pid)
    for name in reservation_keys:
        out += _reservation(before.reservations.get(name), after.reservations.get(name), after, gpus.get(name, set()),
                            cpus.get(name, 0), now)
    for gid in group_keys:
        out += _group(before.groups.get(gid), after.groups.get(gid))
    for uuid in sorted(set(after.drained) - set(before.drained)):
        gpu = gpu_index.get(uuid)
        out.append(Change("drained", f"GPU {gpu} drained: nothing new is placed on it", None,
                          {"gpu": gpu, "gpu_uuid": uuid}))
    for uuid in sorted(set(before.drained) - set(after.drained)):
        gpu = gpu_index.get(uuid)
        out.append(Change("undrained", f"GPU {gpu} undrained", None, {"gpu": gpu, "gpu_uuid": uuid}))
    return out


def _gpus_by_component(doc: StateDoc, group_keys: list[str]) -> dict[str, set[int]]:
    """The GPUs of the groups the commit touched, by each component that owns or uses them.

    A component allocated or placed by a commit got its groups in it (placed,
    attached to, or taken from a reservation: all touched), so its GPUs are
    found there, at the cost of what the commit changed rather than of every
    group of the state for each component."""
    out: dict[str, set[int]] = {}
    for gid in group_keys:
        g = doc.groups.get(gid)
        if g is None:
            continue
        gpus = {d.gpu_index for d in g.devices}
        for name in {g.owner, *(u.rpartition("/")[0] or u for u in g.users)}:
            out.setdefault(name, set()).update(gpus)
    return out


def _cpus_by_component(doc: StateDoc, group_keys: list[str]) -> dict[str, int]:
    """The CPUs counted for the CPU-only groups the commit touched, by the component that owns them."""
    out: dict[str, int] = {}
    for gid in group_keys:
        g = doc.groups.get(gid)
        if g is not None and not g.devices and g.claim.cpus:
            out[g.owner] = out.get(g.owner, 0) + g.claim.cpus
    return out


def _held(gpus: list[int], cpus: int) -> str:
    """`on GPU 0,1`, or for a CPU-only component `4 CPUs`."""
    if gpus or not cpus:
        return f"on GPU {_list(gpus)}"
    return f"{cpus} CPU{'s' if cpus != 1 else ''}"


def _component(old: ComponentRecord | None, new: ComponentRecord | None, gpu_set: set[int],
               cpus: int = 0) -> list[Change]:
    out: list[Change] = []
    placed = old is not None and new is not None and old.state == ComponentState.PENDING and new.state not in (
        ComponentState.PENDING, ComponentState.RELEASING, *ENDED)
    # A claim placed from the queue is a new record (`created` is when it was placed, where its time
    # limit counts from): still the same claim, placed, not one released and another allocated.
    if old is not None and (new is None or new.created != old.created) and not placed:
        out.append(Change("released", f"{old.name} released", old.owner_uid, {"component": old.name}))
        old = None
    if new is None:
        return out
    what: dict[str, Any] = {"component": new.name}
    if old is None:
        if new.state == ComponentState.PENDING:
            out.append(Change("queued", f"{new.name} queued: {new.pending_reason}", new.owner_uid,
                              {**what, "reason": new.pending_reason}))
        else:
            gpus = sorted(gpu_set)
            out.append(Change("allocated", f"{new.name} allocated {_held(gpus, cpus)}", new.owner_uid,
                              {**what, "gpus": gpus, "replicas": new.replicas, "shadow_of": new.shadow_of,
                               "share_with": new.spec.share_with, "deployment": new.deployment}))
        return out
    if placed:
        gpus = sorted(gpu_set)
        out.append(Change("placed", f"{new.name} placed {_held(gpus, cpus)}", new.owner_uid, {**what, "gpus": gpus}))
    elif new.replicas != old.replicas:
        out.append(Change("scaled", f"{new.name} scaled from {old.replicas} to {new.replicas} replicas",
                          new.owner_uid, {**what, "replicas": new.replicas, "from": old.replicas}))
    if new.state in ENDED and old.state not in ENDED:
        outcome = str(new.state)
        out.append(Change(ENDED[new.state], f"{new.name} {outcome}", new.owner_uid, {**what, "outcome": outcome}))
    return out


def _worker(old: WorkerRecord | None, new: WorkerRecord | None, doc: StateDoc,
            worker_pid: WorkerPid) -> list[Change]:
    if new is None:
        return []
    comp = doc.components.get(new.component)
    uid = comp.owner_uid if comp is not None else None
    ref = f"{new.component}/{new.replica}"
    what = {"component": new.component, "replica": new.replica}
    out: list[Change] = []
    if old is not None and new.restarts > old.restarts:
        out.append(Change("restarted", f"{ref} restarts (restart {new.restarts})", uid,
                          {**what, "restarts": new.restarts, "exit_code": new.exit_code}))
    if old is not None and new.promotions > old.promotions:
        out.append(Change("promoted", f"{ref} promoted to primary", uid, {**what, "promotions": new.promotions}))
    if new.pid is not None and (old is None or old.pid != new.pid):
        pid = worker_pid(new.component, new.replica, new.pid) or new.pid
        out.append(Change("worker_started", f"{ref} started as {new.role} (pid {pid})", uid,
                          {**what, "pid": pid, "shim_pid": new.pid, "role": str(new.role)}))
    return out


def _reservation(old: ReservationRecord | None, new: ReservationRecord | None, doc: StateDoc, gpu_set: set[int],
                 cpus: int, now: float) -> list[Change]:
    """A reservation made, or gone: taken by the component of its name, expired, or released."""
    if old is None and new is not None:
        gpus = sorted(gpu_set)
        return [Change("reserved", f"{new.name} reserved {_held(gpus, cpus)}", new.owner_uid,
                       {"reservation": new.name, "gpus": gpus, "expires_at": new.expires_at})]
    if old is None or new is not None:
        return []
    taken = old.name in doc.components and set(old.group_ids) <= doc.groups.keys()
    why = "taken" if taken else "expired" if old.expires_at <= now else "released"
    said = f"taken by component {old.name}" if taken else why
    return [Change("unreserved", f"reservation {old.name} {said}", old.owner_uid,
                   {"reservation": old.name, "why": why})]


def _group(old: GroupRecord | None, new: GroupRecord | None) -> list[Change]:
    """A group made on its own, or deleted; any group draining, or undrained."""
    if new is None:
        if old is not None and old.standalone:
            return [Change("group_deleted", f"group {old.id} deleted", old.owner_uid, {"group": old.id})]
        return []
    gpus = sorted({d.gpu_index for d in new.devices})
    what = {"group": new.id, "gpus": gpus}
    if old is None:
        if not new.standalone:
            return []  # a component's or a reservation's: told as its allocation
        held = _held(gpus, new.claim.cpus or 0)
        return [Change("group_created", f"group {new.id} made {held}", new.owner_uid, what)]
    if new.state == "draining" and old.state != "draining":
        return [Change("drained", f"group {new.id} draining: nothing new attaches to it", new.owner_uid, what)]
    if old.state == "draining" and new.state != "draining":
        return [Change("undrained", f"group {new.id} undrained: it takes new users again", new.owner_uid, what)]
    return []


def _list(gpus: list[int]) -> str:
    return ",".join(map(str, gpus)) if gpus else "-"
