"""The JSON shapes of a deployment (docs/api.md, "Deployments").

The structure (set replicas, scaling-group replicas, component instances)
comes from the plan; what each replica uses and runs comes from the state,
so the tree shows what is, not what was asked. Views read; they never decide.
"""

from __future__ import annotations

from typing import Any

from computegroups.daemon.core.views import component_view, device_view, owner_view
from computegroups.daemon.core.workers import Binding
from computegroups.daemon.deployments.plan import InstancePlan, Plan
from computegroups.statefiles.schema import DeploymentRecord, StateDoc

REPLICA_KEYS = ("index", "role", "state", "restarts", "promotions", "groups", "devices",
                "cuda_visible_devices", "pids")


def deployment_summary(doc: StateDoc, record: DeploymentRecord, plan: Plan) -> dict[str, Any]:
    sizes = record.spec.get("sizes", [])
    return {
        "name": record.name,
        "owner": owner_view(record.owner_uid, record.owner_gid),
        "source": record.source,
        "replicas_wanted": len(sizes),
        "components": len([p for p in plan.instances if p in doc.components]),
        "groups": len([g for g in plan.groups if g in doc.groups]),
        "workers": len([r for r, w in doc.workers.items() if w.component in plan.instances]),
    }


def deployment_tree(
    doc: StateDoc, record: DeploymentRecord, plan: Plan, pids: dict[str, list[int]], naming: str,
    replica_states: dict[str, str], binding: Binding,
) -> dict[str, Any]:
    """Set -> set replicas -> scaling groups -> their replicas -> component
    instances -> replicas, each replica with the groups it uses and its devices."""
    file = record.spec["file"]
    sizes = record.spec["sizes"]

    def node(inst: InstancePlan) -> dict[str, Any]:
        comp = doc.components.get(inst.path)
        view = component_view(doc, comp, pids, naming, replica_states, binding) if comp is not None else None
        return {
            "name": inst.component.name,
            "path": inst.path,
            "state": view["state"] if view else "missing",
            "shadow_of": inst.shadow_of,
            "replicas_wanted": inst.replicas,
            "groups": _owned(plan, doc, inst.path),
            "replicas": [{k: r[k] for k in REPLICA_KEYS} for r in (view["replicas"] if view else [])],
        }

    replicas = []
    for i, size in enumerate(sizes):
        standalone = [node(inst) for inst in plan.instances.values()
                      if inst.set_replica == i and inst.scaling_group is None]
        groups = []
        for g in file["scaling_groups"]:
            owner = f"{record.name}-{i}-{g['name']}"
            groups.append({
                "name": g["name"],
                "path": owner,
                "replicas_wanted": size["scaling_groups"][g["name"]],
                "groups": _owned(plan, doc, owner, None),
                "replicas": [
                    {"index": j, "groups": _owned(plan, doc, owner, j),
                     "components": [node(inst) for inst in plan.instances.values()
                                    if inst.set_replica == i and inst.scaling_group == g["name"]
                                    and inst.group_replica == j]}
                    for j in range(size["scaling_groups"][g["name"]])
                ],
            })
        replicas.append({"index": i, "groups": _owned(plan, doc, record.name, i),
                         "components": standalone, "scaling_groups": groups})
    return {
        "name": record.name,
        "owner": owner_view(record.owner_uid, record.owner_gid),
        "source": record.source,
        "replicas_wanted": len(sizes),
        "claims": {c["name"]: {k: v for k, v in c.items() if k != "name"} for c in file["claims"]},
        "groups": [_group(doc, gid, plan) for gid in plan.groups if gid in doc.groups],
        "set_groups": _owned(plan, doc, record.name, None),
        "replicas": replicas,
    }


def _owned(plan: Plan, doc: StateDoc, owner: str, replica: int | str | None = "any") -> list[str]:
    """Ids of the groups an owner made: all of them, or those of one replica
    index (None: its all-replicas groups)."""
    return [gid for gid, g in plan.groups.items()
            if g.owner == owner and gid in doc.groups and (replica == "any" or g.replica == replica)]


def _group(doc: StateDoc, gid: str, plan: Plan) -> dict[str, Any]:
    g = doc.groups[gid]
    return {
        "id": gid, "claim": plan.groups[gid].claim, "owner": g.owner, "scope": g.scope,
        "replica": g.replica, "state": g.state, "users": list(g.users),
        "devices": [device_view(d) for d in g.devices],
    }
