"""Kubernetes objects <-> the provider documents of docs/api.md, with no I/O.

The provider reads Nodes, DRA ResourceSlices, ResourceClaims, holder pods
and DeviceTaintRules, and answers Group, GpuStatus and machine documents
shaped as cgd's, so `ComputeGroupManager` cannot tell the two apart. Every
answer is derived from the cluster's objects of the moment: nothing is kept
on the side that could disagree with the API server.

Device attributes are those NVIDIA's DRA driver (k8s-dra-driver-gpu,
`gpu.nvidia.com`) publishes: `uuid`, `productName`, `type` (`gpu`, `mig`),
`parentUUID` and `profile` for MIG devices, capacity `memory` in bytes. The
driver no longer publishes a GPU index (removed in its commit 36fc80ab);
its device names are `gpu-<minor>` and `gpu-<minor>-mig-...`, so the index
here is the minor number read from the name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lightkube.utils.quantity import parse_quantity

from computegroups.daemon.kubernetes.render_claims import claim_template_spec
from computegroups.daemon.kubernetes.render_selectors import selector_problems
from computegroups.daemon.model.claims import Claim
from computegroups.topology.names import model_matches

Json = Any
Obj = Mapping[str, Any]

DRIVER = "gpu.nvidia.com"

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "computegroups"
COMPONENT = "computegroups.io/component"
REPLICA = "computegroups.io/replica"
GROUP = "computegroups.io/group"
DEPLOYMENT = "computegroups.io/deployment"
CLAIM = "computegroups.io/claim"
SCOPE = "computegroups.io/scope"
ATTACHED = "computegroups.io/attached"
"""On a holder pod of a component that attaches to a group made on its own (`"group": ID`): the
pod is that component's replica, using the group's claim beside the group's own holder."""
DRAIN_KEY = "computegroups.io/drain"
HOLDER_CLAIM = "group"
"""The name the holder pod gives the claim it uses, and its container refers to."""

_DEVICE_NAME = re.compile(r"^gpu-(\d+)(?:-|$)")
MIB = 1024 * 1024

UNSUPPORTED = {
    "exclusive": "a domain kept to one claim has no DRA form",
    "pool": "local pools are cgd's; on a cluster use a DeviceClass or node selector",
    "gpu_ids": "pinned GPU ids have no meaning across nodes",
    "strategy": "the scheduler decides the packing",
    "allow_busy": "the scheduler knows no foreign processes",
    "affinity": "use pod affinity in a deployment",
    "anti_affinity": "use pod anti-affinity in a deployment",
    "cpus": "CPUs are a pod's resources.requests.cpu, not a DRA claim; a CPU-only claim has no device to claim",
}
"""Claim keys with no Kubernetes form: refused by name, never dropped."""

NO_ATTRIBUTE = {"nvlink", "numa"}
"""Domains NVIDIA's driver publishes no attribute for: a claim's devices are on one node, no closer."""


def managed_labels(**more: str) -> dict[str, str]:
    return {MANAGED_BY: MANAGER, **more}


def selector(**more: str) -> dict[str, str]:
    """A label selector (lightkube's `labels=`) for the objects the provider made."""
    return managed_labels(**more)


# -- claims --------------------------------------------------------------------


def check_claim(claim: Mapping[str, Json]) -> list[str]:
    """Refuse what has no Kubernetes form; answer the warnings of what is kept in a weaker form."""
    for key, why in UNSUPPORTED.items():
        if claim.get(key) not in (None, False, (), []):
            raise ValueError(f"{key}: not supported by the Kubernetes provider ({why})")
    for key, why in selector_problems(Claim.from_dict(claim)).items():
        raise ValueError(f"{key}: not supported by the Kubernetes provider ({why})")
    if claim.get("priority"):
        raise ValueError("priority: not supported by the Kubernetes provider (use a PriorityClass)")
    colocate = claim.get("colocate")
    if colocate in NO_ATTRIBUTE and (claim.get("gpus") or 1) > 1:
        return [f"colocate {colocate}: NVIDIA's DRA driver publishes no {colocate} attribute; "
                "the claim's devices are on one node, nothing closer is asked"]
    return []


def claim_object(name: str, namespace: str, claim: Claim, sharing: str,
                 labels: Mapping[str, str]) -> dict[str, Json]:
    """The ResourceClaim (resource.k8s.io/v1) for one group: its spec is the one `cgctl render
    kubernetes` gives the same claim (render_claims.py), so a group and a deployment's claim
    template of the same claim ask the cluster the same thing."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels),
                     "annotations": {CLAIM: json.dumps(claim.to_dict(), sort_keys=True)}},
        "spec": claim_template_spec(claim, sharing),
    }


def holder_object(claim_name: str, namespace: str, image: str, labels: Mapping[str, str],
                  node: str | None = None, pod_name: str | None = None) -> dict[str, Json]:
    """The pod that holds a claim: the scheduler allocates only claims a pod uses,
    so this is the cluster's form of a reservation. It runs `image` (a pause
    container) and nothing else. `pod_name`: another pod on the same claim
    (an attached component's replica: DRA shares an allocated claim among the
    pods that reference it), instead of the claim's own holder."""
    spec: dict[str, Json] = {
        "resourceClaims": [{"name": HOLDER_CLAIM, "resourceClaimName": claim_name}],
        "containers": [{"name": "holder", "image": image, "resources": {"claims": [{"name": HOLDER_CLAIM}]}}],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 0,
    }
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name or holder_name(claim_name), "namespace": namespace,
                     "labels": {**labels, GROUP: claim_name}},
        "spec": spec,
    }


def holder_name(claim_name: str) -> str:
    return f"{claim_name}-holder"


def user_holder_object(component: str, replica: int, group_id: str, namespace: str,
                       image: str) -> dict[str, Json]:
    """Replica `replica` of a component attached to the group `group_id` (a claim made on its own):
    a holder pod of the component's that references the group's claim."""
    labels = managed_labels(**{COMPONENT: component, REPLICA: str(replica), ATTACHED: "true"})
    return holder_object(group_id, namespace, image, labels, pod_name=holder_name(f"{component}-{replica}"))


def attached_users(pods: Iterable[Obj]) -> dict[str, list[tuple[str, int]]]:
    """group id -> the (component, replica) of each attached holder pod that uses it, in order."""
    users: dict[str, list[tuple[str, int]]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(ATTACHED) != "true" or meta.get("deletionTimestamp") or GROUP not in labels:
            continue
        users.setdefault(labels[GROUP], []).append((labels.get(COMPONENT, ""), int(labels.get(REPLICA, 0))))
    return {g: sorted(u) for g, u in users.items()}


# -- devices -------------------------------------------------------------------


def _attr(device: Obj, name: str) -> Json:
    """A device attribute's value, whichever of string/int/bool/version it is."""
    value = (device.get("attributes") or {}).get(name) or {}
    for kind in ("string", "int", "bool", "version"):
        if kind in value:
            return value[kind]
    return None


def _version(value: Json) -> tuple[int, int] | None:
    """A semver attribute (`9.0.0`) as (major, minor)."""
    parts = str(value or "").split(".")
    try:
        return (int(parts[0]), int(parts[1])) if len(parts) >= 2 else None
    except ValueError:
        return None


def _mib(quantity: Json) -> int | None:
    if quantity is None:
        return None
    if isinstance(quantity, Mapping):
        quantity = quantity.get("value")
    if quantity is None:
        return None
    parsed = parse_quantity(str(quantity))
    return None if parsed is None else int(parsed // MIB)


def slice_devices(slices: Iterable[Obj]) -> dict[tuple[str, str], dict[str, Json]]:
    """(pool, device name) -> a Device-like view of every GPU and MIG device NVIDIA's driver publishes."""
    found: dict[tuple[str, str], dict[str, Json]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != DRIVER:
            continue
        pool = str((spec.get("pool") or {}).get("name") or spec.get("nodeName"))
        node = spec.get("nodeName") or pool
        for d in spec.get("devices") or []:
            match = _DEVICE_NAME.match(d.get("name", ""))
            mig = _attr(d, "type") == "mig"
            found[(pool, d["name"])] = {
                "node": node, "pool": pool, "device": d["name"],
                "index": int(match.group(1)) if match else None,
                "uuid": _attr(d, "parentUUID") if mig else _attr(d, "uuid"),
                "mig_uuid": _attr(d, "uuid") if mig else None,
                "mig_profile": _attr(d, "profile") if mig else None,
                "name": _attr(d, "productName"),
                "compute_capability": _version(_attr(d, "cudaComputeCapability")),
                "memory_mib": _mib((d.get("capacity") or {}).get("memory")),
                "shareable": bool(d.get("allowMultipleAllocations")),
                "taints": list(d.get("taints") or []),
            }
    return found


def machines(nodes: Iterable[Obj], devices: Mapping[tuple[str, str], Mapping[str, Json]]) -> list[dict[str, Json]]:
    """One machine document per node that has NVIDIA devices, as `discover_resources` answers."""
    per_node: dict[str, list[Mapping[str, Json]]] = {}
    for d in devices.values():
        per_node.setdefault(d["node"], []).append(d)
    out = []
    for node in nodes:
        meta = node.get("metadata") or {}
        name = meta.get("name")
        if name not in per_node:
            continue
        ready = next((c.get("status") for c in (node.get("status") or {}).get("conditions") or []
                      if c.get("type") == "Ready"), None)
        gpus = sorted((d for d in per_node[name] if d["mig_uuid"] is None), key=_order)
        migs = sorted((d for d in per_node[name] if d["mig_uuid"] is not None), key=_order)
        out.append({"id": name, "machine": {
            "hostname": name, "source": "kubernetes", "ready": ready == "True",
            "labels": dict(meta.get("labels") or {}),
            "gpus": [{"index": d["index"], "uuid": d["uuid"], "name": d["name"], "memory_mib": d["memory_mib"],
                      "device": d["device"]} for d in gpus],
            "mig": [{"index": d["index"], "uuid": d["mig_uuid"], "profile": d["mig_profile"],
                     "memory_mib": d["memory_mib"], "device": d["device"]} for d in migs],
        }})
    return out


def _order(d: Mapping[str, Json]) -> tuple[int, str]:
    return (d["index"] if d["index"] is not None else 1 << 30, d["device"])


# -- groups --------------------------------------------------------------------


def stored_claim(claim: Obj) -> dict[str, Json]:
    raw = ((claim.get("metadata") or {}).get("annotations") or {}).get(CLAIM)
    return dict(json.loads(raw)) if raw else {}


def allocated_devices(claim: Obj, devices: Mapping[tuple[str, str], Mapping[str, Json]]) -> list[dict[str, Json]]:
    """The group's Devices, from the claim's `status.allocation.devices.results`."""
    asked = stored_claim(claim)
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    out = []
    for r in results:
        if r.get("driver") != DRIVER:
            continue
        known = devices.get((r.get("pool"), r.get("device")), {})
        whole = not (asked.get("memory_mib") or asked.get("compute_pct")) or asked.get("share") == "whole" \
            or str(r.get("request", "")).endswith("/whole")  # `share = "any"` served by its whole device
        memory, compute = known.get("memory_mib"), 100
        if not whole:  # what the device gave (consumable capacity), else what MPS limits the share to
            consumed = r.get("consumedCapacity") or {}
            memory = _mib(consumed.get("memory")) or asked.get("memory_mib") or memory
            compute = int(consumed.get("compute") or asked.get("compute_pct") or 100)
        out.append({
            "index": known.get("index"), "uuid": known.get("uuid"), "mig_uuid": known.get("mig_uuid"),
            "memory_mib": memory, "compute_pct": compute,
            "whole": whole and known.get("mig_uuid") is None, "name": known.get("name"),
            "node": known.get("node") or r.get("pool"), "pool": r.get("pool"), "device": r.get("device"),
        })
    return out


def group_document(claim: Obj, devices: Mapping[tuple[str, str], Mapping[str, Json]],
                   drained: bool, reason: str | None,
                   attached: Sequence[tuple[str, int]] = ()) -> dict[str, Json]:
    """The Group document of one ResourceClaim: `pending` until the scheduler allocates it
    (with its reason), `draining` while a DeviceTaintRule of ours covers it. `attached`: the
    components' replicas whose holder pods use it besides its own holder."""
    meta = claim.get("metadata") or {}
    labels = meta.get("labels") or {}
    found = allocated_devices(claim, devices)
    allocated = bool((claim.get("status") or {}).get("allocation"))
    component = labels.get(COMPONENT)
    replica = int(labels[REPLICA]) if REPLICA in labels else None
    state = "pending" if not allocated else "draining" if drained else "allocated"
    node = next((d["node"] for d in found), None)
    return {
        "id": meta.get("name"), "state": state, "owner": component,
        "users": ([f"{component}/{replica}"] if component is not None and replica is not None else [])
        + [f"{c}/{i}" for c, i in attached],
        "scope": labels.get(SCOPE, "per-replica") if component else None, "replica": replica,
        "claim": stored_claim(claim), "devices": found, "domain": node, "exclusive_domain": None,
        "priority": 0, "created": meta.get("creationTimestamp"),
        "explanation": None if allocated else reason or "waiting for the scheduler",
        "reservation": None,
        "deployment": labels.get(DEPLOYMENT),
        "node": node, "namespace": meta.get("namespace"),
        "holder": holder_name(str(meta.get("name"))),
    }


def component_document(name: str, groups: Sequence[Mapping[str, Json]],
                       attached: Sequence[int] = ()) -> dict[str, Json]:
    """A Component from its groups. `scheduling` while the scheduler has not
    placed every group yet (its reason in `queue`): on a cluster an
    allocation that does not fit waits rather than being refused.

    `attached`: the component's replicas attach to `groups[0]`, a group made
    on its own (`"group": ID`), one holder pod per replica index."""
    scope: str | None
    if attached:
        uses = [(i, groups[0]) for i in sorted(attached)]
        scope = "all-replicas"
    else:
        uses = sorted(((g.get("replica") or 0, g) for g in groups), key=lambda u: u[0])
        scope = groups[0].get("scope") if groups else None
    pending = [g for _, g in uses if g["state"] == "pending"]
    replicas = [{"index": i, "group": g["id"], "groups": [g["id"]], "role": "primary",
                 "state": "pending" if g["state"] == "pending" else "allocated", "devices": g["devices"],
                 "node": g.get("node")} for i, g in uses]
    return {
        "name": name, "state": "scheduling" if pending else "allocated",
        "replicas_wanted": len(uses), "scope": scope,
        "replicas": replicas,
        "queue": {"reason": pending[0]["explanation"]} if pending else None,
        "explanation": pending[0]["explanation"] if pending else None,
    }


def gpu_statuses(devices: Mapping[tuple[str, str], Mapping[str, Json]], groups: Iterable[Mapping[str, Json]],
                 drained: set[tuple[str, str]]) -> list[dict[str, Json]]:
    """GpuStatus per physical GPU, with cgd's keys (docs/api.md) so both providers answer one shape:
    what the cluster's allocated claims of ours take of it. What a cluster does not tell (foreign
    processes, measurements, a lost state generation's workers) is empty or null."""
    used: dict[tuple[str, str], list[tuple[Mapping[str, Json], Mapping[str, Json]]]] = {}
    for g in groups:
        for d in g.get("devices") or []:
            used.setdefault((d["pool"], d["device"]), []).append((g, d))
    migs: dict[str | None, list[Mapping[str, Json]]] = {}
    for d in devices.values():
        if d["mig_uuid"] is not None:
            migs.setdefault(d["uuid"], []).append(d)
    out = []
    for key, d in sorted(devices.items(), key=lambda kv: (kv[1]["node"], _order(kv[1]))):
        if d["mig_uuid"] is not None:
            continue
        taken = [x for _, x in used.get(key, [])]
        on = [g for g, _ in used.get(key, [])]
        unhealthy = [t for t in d["taints"] if t.get("effect") == "NoExecute"]
        out.append({
            "index": d["index"], "uuid": d["uuid"], "name": d["name"], "memory_mib": d["memory_mib"],
            "memory_allocated_mib": sum(x.get("memory_mib") or 0 for x in taken),
            "memory_foreign_mib": 0,
            "compute_allocated_pct": min(100, sum(x.get("compute_pct") or 0 for x in taken)),
            "exclusive_owner": next((g.get("owner") for g, x in used.get(key, []) if x.get("whole")), None),
            "components": [{"name": name, "user": None, "state": "allocated", "reservation": None,
                            "shadow_of": None, "memory_used_mib": None}
                           for name in sorted({u.rsplit("/", 1)[0] for g in on for u in g.get("users") or []})],
            "groups": sorted({str(g["id"]) for g in on}),
            "health": "unhealthy" if unhealthy else "ok",
            "reasons": [str(t.get("key")) for t in unhealthy],
            "drained": key in drained, "degraded": False,
            "foreign_processes": [], "over_share": [], "held_by_lost": [],
            "mig_devices": [{"uuid": m["mig_uuid"], "profile": m.get("mig_profile"), "memory_mib": m["memory_mib"],
                             "group": next((g["id"] for g, _ in used.get((m["pool"], m["device"]), [])), None)}
                            for m in migs.get(d["uuid"], [])],
            "temperature_c": None, "measured": None,
            "node": d["node"], "device": d["device"],
        })
    return out


def pod_reason(pod: Obj | None, events: Iterable[Obj]) -> str | None:
    """Why the scheduler has not placed the holder: its PodScheduled condition, else its latest event."""
    if pod is not None:
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                text = c.get("message") or c.get("reason")
                if text:
                    return str(text)
    latest = [e for e in events if e.get("type") == "Warning" or e.get("reason") == "FailedScheduling"]
    if latest:
        return str(latest[-1].get("message") or latest[-1].get("reason"))
    return None


def taint_rule_object(name: str, group_id: str, device: Mapping[str, Json], api_version: str) -> dict[str, Json]:
    """A DeviceTaintRule that keeps new claims off one of the group's devices (NoSchedule):
    what the scheduler itself reads, so a drain cannot be ignored."""
    return {
        "apiVersion": api_version, "kind": "DeviceTaintRule",
        "metadata": {"name": name, "labels": managed_labels(**{GROUP: group_id})},
        "spec": {"deviceSelector": {"driver": DRIVER, "pool": device["pool"], "device": device["device"]},
                 "taint": {"key": DRAIN_KEY, "value": group_id, "effect": "NoSchedule"}},
    }


def drained_devices(rules: Iterable[Obj]) -> tuple[set[str], set[tuple[str, str]]]:
    """The groups our taint rules drain, and the (pool, device) pairs they cover."""
    groups, covered = set(), set()
    for rule in rules:
        labels = (rule.get("metadata") or {}).get("labels") or {}
        if GROUP in labels:
            groups.add(labels[GROUP])
        sel = (rule.get("spec") or {}).get("deviceSelector") or {}
        if sel.get("pool") and sel.get("device"):
            covered.add((sel["pool"], sel["device"]))
    return groups, covered


def fits_somewhere(claim: Mapping[str, Json], devices: Mapping[tuple[str, str], Mapping[str, Json]]) -> bool:
    """Whether any one node has devices enough for the claim at all (a claim is
    allocated on one node), among those its selectors admit: a claim that can
    never fit is refused up front, as cgd refuses it, instead of waiting for ever."""
    asked = Claim.from_dict(dict(claim))
    per_node: dict[str, list[Mapping[str, Json]]] = {}
    for d in devices.values():
        if selected(d, asked):
            per_node.setdefault(d["node"], []).append(d)
    for found in per_node.values():
        gpus = [d for d in found if d["mig_uuid"] is None]
        if asked.kind == "whole":
            if _enough(gpus, asked):
                return True
        elif asked.kind == "mig":
            if any(d["mig_profile"] == asked.mig for d in found):
                return True
        elif any((d["memory_mib"] or 0) >= (asked.memory_mib or 0) for d in gpus):
            return True
    return False


def selected(device: Mapping[str, Json], claim: Claim) -> bool:
    """Whether the claim's selectors admit the device, as its CEL selectors would (render_selectors.py)."""
    if claim.model is not None and not model_matches(str(device.get("name") or ""), claim.model):
        return False
    if claim.min_memory_mib is not None and device["mig_uuid"] is None \
            and (device.get("memory_mib") or 0) < claim.min_memory_mib:
        return False
    if claim.compute_capability is not None:
        wanted = tuple(int(p) for p in claim.compute_capability.split("."))
        if device.get("compute_capability") is None or device["compute_capability"] < wanted:
            return False
    return True


def _enough(gpus: Sequence[Mapping[str, Json]], claim: Claim) -> bool:
    """`gpus` whole devices, all of one model where the claim says `same = "model"`."""
    count = claim.gpus or 1
    if claim.same is None:
        return len(gpus) >= count
    models: dict[Json, int] = {}
    for d in gpus:
        models[d.get("name")] = models.get(d.get("name"), 0) + 1
    return any(n >= count for n in models.values())
