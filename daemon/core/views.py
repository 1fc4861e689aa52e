"""The JSON shapes of docs/api.md, built from the state and live facts.

Views read; they never decide. Keeping them apart means `cgctl --json` keys
change only when this file does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from computegroups.daemon.core.queue import queue_order
from computegroups.daemon.core.workers import Binding, replica_groups, replica_ref, visible_devices
from computegroups.daemon.model.refs import component_of
from computegroups.daemon.placement.allocator import DoesNotFitNow
from computegroups.daemon.placement.explain import UNAVAILABLE
from computegroups.daemon.supervision.workerenv import cuda_visible_devices
from computegroups.statefiles.schema import ComponentRecord, GroupRecord, ReservationRecord, StateDoc
from computegroups.topology.model import Machine
from computegroups.topology.ranges import format_ranges


def user_name(uid: int) -> str:
    """A person's login for messages on a shared box ("belongs to alice"); the uid when it has none."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def capacity_refusal(doc: StateDoc, refusal: DoesNotFitNow, unavailable: Mapping[int, str] | None = None) -> str:
    """The allocator's refusal with people in it: "in use by alice (component train): GPUs 0-5".

    The allocator names the groups in the way (it knows nothing of users);
    here each becomes its owner and what it belongs to, from the state. A GPU
    it only knows as unavailable gets its cause from `unavailable` (drained,
    unhealthy, held by a lost generation's worker).
    """
    named = {}
    for gpu, why in refusal.reasons.items():
        if why == UNAVAILABLE and unavailable and gpu in unavailable:
            named[gpu] = unavailable[gpu]
            continue
        held = refusal.holders.get(gpu)
        if not held:
            named[gpu] = why
            continue
        who = holders_phrase(doc, held)
        named[gpu] = f"{why} by {who}" if why.startswith("in use") else f"{why}, used by {who}"
    return refusal.worded(named)


def holders_phrase(doc: StateDoc, group_ids: Iterable[str]) -> str:
    """`alice (component train)`, `alice (components a, b) and bob (reservation r)`."""
    by_user: dict[str, dict[str, list[str]]] = {}
    for gid in sorted(group_ids):
        g = doc.groups.get(gid)
        if g is None:
            continue
        kind, name = _holder(doc, g)
        names = by_user.setdefault(user_name(g.owner_uid), {}).setdefault(kind, [])
        if name not in names:
            names.append(name)
    parts = [f"{user} ({'; '.join(_listed(kind, names) for kind, names in kinds.items())})"
             for user, kinds in sorted(by_user.items())]
    return " and ".join(parts) or "another group"


def _holder(doc: StateDoc, g: GroupRecord) -> tuple[str, str]:
    """What a group is held for, as a person calls it: a component, a deployment, a reservation."""
    if g.state == "reserved":
        return "reservation", g.owner
    comp = doc.components.get(g.owner) or next(
        (doc.components[c] for c in (component_of(u) for u in g.users) if c in doc.components), None)
    if comp is not None and comp.deployment:
        return "deployment", comp.deployment
    if comp is not None and comp.name == g.owner:
        return "component", comp.name
    return "group", g.id


def _listed(kind: str, names: list[str]) -> str:
    return f"{kind}{'s' if len(names) > 1 else ''} {', '.join(names)}"


def owner_view(uid: int, gid: int) -> dict[str, Any]:
    name = user_name(uid)
    return {"uid": uid, "gid": gid, "user": name if not name.startswith("uid ") else str(uid)}


def device_view(dev) -> dict[str, Any]:
    return {
        "index": dev.gpu_index, "uuid": dev.gpu_uuid, "mig_uuid": dev.mig_uuid,
        "memory_mib": dev.memory_mib, "compute_pct": dev.compute_pct, "whole": dev.whole,
    }


def group_deployment(doc: StateDoc, g: GroupRecord) -> str | None:
    """The deployment whose plan made the group: that of the components it was made for."""
    for name in (g.owner, *(component_of(u) for u in g.users)):
        comp = doc.components.get(name)
        if comp is not None and comp.deployment is not None:
            return comp.deployment
    return None


def group_view(doc: StateDoc, g: GroupRecord) -> dict[str, Any]:
    reservation = next((r.name for r in doc.reservations.values() if g.id in r.group_ids), None)
    return {
        "id": g.id, "state": g.state, "owner": g.owner,
        "owner_uid": g.owner_uid, "users": list(g.users), "scope": g.scope,
        "replica": g.replica, "claim": g.claim.to_dict(),
        "devices": [device_view(d) for d in g.devices],
        "domain": list(g.domain) if g.domain is not None else None,
        "exclusive_domain": list(g.exclusive_domain) if g.exclusive_domain is not None else None,
        "priority": g.priority, "created": g.created, "explanation": g.explanation,
        "reservation": reservation,
        "deployment": group_deployment(doc, g),
    }


def component_view(
    doc: StateDoc, comp: ComponentRecord, pids: dict[str, list[int]], naming: str,
    replica_states: dict[str, str], binding: Binding, memory: dict[str, int] | None = None,
) -> dict[str, Any]:
    replicas = []
    explanations: list[str] = []
    for i in range(comp.replicas):
        ref = replica_ref(comp.name, i)
        groups = replica_groups(doc, comp.name, i)
        devices = visible_devices(groups)
        worker = doc.workers.get(ref)
        role = worker.role if worker else ("shadow" if comp.shadow_of else "primary")
        if comp.state == "lost":
            state = "lost"
        elif worker is not None and worker.outcome is not None:
            state = worker.outcome
        elif comp.state == "pending":
            state = "pending"
        else:
            state = replica_states.get(ref) or ("running" if worker and worker.pid else
                                                ("allocated" if worker is None else "starting"))
        replicas.append({
            "index": i,
            "group": groups[0].id if groups else None,
            "groups": [g.id for g in groups],
            "role": role,
            "state": state,
            "restarts": worker.restarts if worker else 0,
            "promotions": worker.promotions if worker else 0,
            "devices": [
                {"index": d.gpu_index, "uuid": d.gpu_uuid, "mig_uuid": d.mig_uuid,
                 "memory_mib": d.memory_mib, "compute_pct": d.compute_pct, "whole": d.whole}
                for d in devices
            ],
            "cuda_visible_devices": cuda_visible_devices(devices, naming),
            "cpus": sum(g.claim.cpus or 0 for g in groups),
            "cpu_binding": format_ranges(binding(comp, devices)) or None,
            "pids": pids.get(ref, []),
            "memory_bytes": (memory or {}).get(ref),
            "started_at": worker.started_at if worker else None,
            "ended_at": worker.ended_at if worker else None,
            "exit_code": worker.exit_code if worker else None,
        })
        explanations.extend(g.explanation for g in groups if g.explanation not in explanations)
    spec = comp.spec
    state = str(comp.state)
    if state == "running" and any(r["state"] == "restarting" for r in replicas):
        state = "restarting"
    queue = None
    if comp.state == "pending":
        order = [c.name for c in queue_order(doc)]
        queue = {"position": order.index(comp.name) + 1, "reason": comp.pending_reason,
                 "queued_at": comp.queued_at, "detached": comp.waiter_pid is None and comp.lease_pid is None}
    return {
        "name": comp.name,
        "owner": owner_view(comp.owner_uid, comp.owner_gid),
        "state": state,
        "restart": spec.restart.mode,
        "time_limit_s": spec.time_limit_s,
        "stop_timeout_s": spec.stop_timeout_s,
        "ended_at": comp.ended_at,
        "duration_s": comp.ended_at - comp.created if comp.ended_at is not None else None,
        "exit_code": job_exit_code(replicas) if comp.ended_at is not None else None,
        "queue": queue,
        "replicas_wanted": comp.replicas,
        "scope": spec.scope,
        "share_with": spec.share_with,
        "group": spec.group,
        "shadow_of": comp.shadow_of,
        "deployment": comp.deployment,
        "command": list(spec.command) if spec.command is not None else None,
        "created": comp.created,
        "lease_pid": comp.lease_pid,
        "replicas": replicas,
        "explanation": "; ".join(e for e in explanations if e),
    }


GLANCE_STATES = ("pending", "restarting", "degraded", "lost", "failed", "timeout", "completed")
"""The component states `cgctl status` lists, in its order: what waits or needs a look first."""


def component_glance(view: dict[str, Any]) -> dict[str, Any]:
    """One component of `GET /v1/status`'s `components`: enough for a line of `cgctl status`."""
    return {
        "name": view["name"], "state": view["state"], "user": view["owner"]["user"],
        "queue": view["queue"], "exit_code": view["exit_code"], "ended_at": view["ended_at"],
        "duration_s": view["duration_s"], "restarts": sum(r["restarts"] for r in view["replicas"]),
    }


def components_at_a_glance(views: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The components in a state worth a look (`GLANCE_STATES`), the queue first in its order, then
    those that restart or are unwell, then the ended ones, the latest first."""
    chosen = [component_glance(v) for v in views if v["state"] in GLANCE_STATES]
    return sorted(chosen, key=lambda c: (GLANCE_STATES.index(c["state"]),
                                         (c["queue"] or {}).get("position", 0), -(c["ended_at"] or 0), c["name"]))


def job_exit_code(replicas: list[dict[str, Any]]) -> int:
    """What `cgctl wait` exits with: the first non-zero replica status, 128+N for signal N (as a shell says).

    A replica stopped at its time limit reads 124, as with timeout(1); one
    that ended with no status to tell (it never started) reads 1.
    """
    for r in replicas:
        code = r["exit_code"]
        if r["state"] == "timeout":
            return 124
        if code is None:
            return 1
        if code != 0:
            return 128 - code if code < 0 else code
    return 0


def reservation_view(doc: StateDoc, r: ReservationRecord) -> dict[str, Any]:
    return {
        "name": r.name,
        "owner": owner_view(r.owner_uid, r.owner_gid),
        "expires_at": r.expires_at,
        "priority": r.priority,
        "groups": [group_view(doc, doc.groups[g]) for g in r.group_ids if g in doc.groups],
    }


def gpu_status(
    machine: Machine, doc: StateDoc, health: dict[int, dict[str, Any]],
    measured: Mapping[int, dict[str, Any]] | None = None,
    used_by_replica: Mapping[int, Mapping[str, int]] | None = None,
    pids: Mapping[str, list[int]] | None = None,
    states: Mapping[str, str] | None = None,
    held_by_lost: Mapping[int, list[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """Each GPU: what is allocated on it (from the state) beside what NVML measured (the
    health loop's last sample: `measured`, and per replica `used_by_replica`), and the workers
    of a lost generation of the state that hold it though the state has no group there."""
    drained = set(doc.drained)
    measured = measured or {}
    used_by_replica = used_by_replica or {}
    live = {ref for ref, p in (pids or {}).items() if p}
    out = []
    for gpu in machine.gpus:
        groups = [g for g in doc.groups.values() if any(d.gpu_index == gpu.index for d in g.devices)]
        mem = sum(d.memory_mib for g in groups for d in g.devices if d.gpu_index == gpu.index)
        sm = sum(d.compute_pct for g in groups for d in g.devices if d.gpu_index == gpu.index)
        exclusive = next(
            (g.owner for g in groups for d in g.devices
             if d.gpu_index == gpu.index and d.whole and d.mig_uuid is None), None,
        )
        names = sorted({component_of(u) for g in groups for u in g.users})
        reserved = sorted({g.owner for g in groups if g.state == "reserved"} - set(names))
        usage = used_by_replica.get(gpu.index)
        facts = health.get(gpu.index, {})
        out.append({
            "index": gpu.index, "uuid": gpu.uuid, "name": gpu.name,
            "memory_mib": gpu.memory_mib,
            "memory_allocated_mib": mem,
            "memory_foreign_mib": sum(p["used_memory_mib"] or 0 for p in facts.get("foreign", [])),
            "compute_allocated_pct": min(sm, 100) if not gpu.mig_enabled else None,
            "exclusive_owner": exclusive,
            "components": [gpu_component(doc, name, usage, live, states or {}) for name in names]
                          + [gpu_reservation(doc, name) for name in reserved],
            "groups": sorted(g.id for g in groups),
            "health": facts.get("health", "ok"),
            "reasons": facts.get("reasons", []),
            "drained": gpu.uuid in drained,
            "degraded": any(g.state == "degraded" for g in groups),
            "foreign_processes": facts.get("foreign", []),
            "over_share": facts.get("over_share", []),
            "held_by_lost": list((held_by_lost or {}).get(gpu.index, [])),
            "mig_devices": [
                {"uuid": m.uuid, "profile": m.profile, "memory_mib": m.memory_mib,
                 "group": next((g.id for g in groups for d in g.devices if d.mig_uuid == m.uuid), None)}
                for m in gpu.mig_devices
            ],
            "temperature_c": facts.get("temperature_c"),
            "measured": measured.get(gpu.index),
        })
    return out


def gpu_component(
    doc: StateDoc, name: str, usage: Mapping[str, int] | None, live: set[str], states: Mapping[str, str],
) -> dict[str, Any]:
    """One component on a GPU: who, in what state, and the memory its workers use there.

    `memory_used_mib` is null when unknown: no sample of this GPU yet (or it
    is lost), or none of the component's workers runs; 0 when they run and
    NVML lists none of their processes on it.
    """
    comp = doc.components.get(name)
    mine = [ref for ref in live if component_of(ref) == name]
    used = None if usage is None or not mine else sum(usage.get(ref, 0) for ref in mine)
    return {
        "name": name,
        "user": user_name(comp.owner_uid) if comp is not None else None,
        "state": states.get(name, str(comp.state) if comp is not None else "unknown"),
        "reservation": False,
        "shadow_of": comp.shadow_of if comp is not None else None,
        "memory_used_mib": used,
    }


def gpu_reservation(doc: StateDoc, name: str) -> dict[str, Any]:
    r = doc.reservations.get(name)
    return {"name": name, "user": user_name(r.owner_uid) if r is not None else None,
            "state": "reserved", "reservation": True, "shadow_of": None, "memory_used_mib": None}
