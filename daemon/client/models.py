"""`ComputeGroup` and `ComputeNode`, the manager's answers, read from cgd's documents.

They are snapshots: built from one answer of the daemon and never updated,
so a scheduler can compare two of them, and an object in hand never changes
under it. Each keeps the document it came from in `document` for the fields
the seed does not name.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Json = Any


def _by_index(gpus: Iterable[Mapping[str, Json]]) -> dict[int, Mapping[str, Json]]:
    return {g["index"]: g for g in gpus}


def _on_node(docs: Iterable[Mapping[str, Json]], node: str | None) -> list[Mapping[str, Json]]:
    """The documents of one node. A provider with several (Kubernetes) names each GPU's and
    group's `node` (None: a group not placed yet, on no node); cgd's documents have no `node`,
    and all are of its one machine."""
    return [d for d in docs if node is None or "node" not in d or d["node"] == node]


def _usage(gpus: Sequence[Mapping[str, Json]]) -> dict[str, float | None]:
    """What is handed out and what NVML measured, under separate keys, as fractions (0 to 1).

    Allocated is the state's bookkeeping: an idle worker holding a whole GPU
    has all of its memory and compute allocated while its GPU sits at 0%.
    Measured comes from the health loop's last sample (GpuStatus `measured`)
    and is None where no GPU was sampled yet (or no driver answers):

    - `memory_allocated`, `compute_allocated`: claimed by compute groups;
    - `memory_foreign`: used by processes cgd does not run (NVML);
    - `memory_used`: in use by every process, as NVML measures it;
    - `gpu_utilization`, `memory_utilization`: NVML's utilization rates
      (time a kernel ran, time memory was read or written), averaged.
    """
    total = sum(g.get("memory_mib") or 0 for g in gpus)
    allocated = sum(g.get("memory_allocated_mib") or 0 for g in gpus)
    foreign = sum(g.get("memory_foreign_mib") or 0 for g in gpus)
    compute = sum(g.get("compute_allocated_pct") or 0 for g in gpus)
    measured = [g["measured"] for g in gpus if g.get("measured")]
    used = [(m["memory_used_mib"], g.get("memory_mib") or 0) for g in gpus
            if (m := g.get("measured")) and m.get("memory_used_mib") is not None]
    return {
        "memory_allocated": _fraction(allocated, total),
        "memory_foreign": _fraction(foreign, total),
        "compute_allocated": _fraction(compute, 100 * len(gpus)),
        "memory_used": _fraction(sum(u for u, _ in used), sum(t for _, t in used)) if used else None,
        "gpu_utilization": _mean([m.get("utilization_gpu_pct") for m in measured]),
        "memory_utilization": _mean([m.get("utilization_memory_pct") for m in measured]),
    }


def _fraction(part: float, whole: float) -> float:
    return round(part / whole, 4) if whole else 0.0


def _mean(percents: list[int | None]) -> float | None:
    known = [p for p in percents if p is not None]
    return round(sum(known) / len(known) / 100, 4) if known else None


@dataclass(frozen=True)
class ComputeGroup:
    """Devices (whole GPUs, shares of one, MIG instances) handed out as a unit."""

    document: Mapping[str, Json]
    gpu_status: Mapping[int, Mapping[str, Json]] = field(default_factory=dict)

    @classmethod
    def from_documents(cls, group: Mapping[str, Json],
                       gpus: Iterable[Mapping[str, Json]] = ()) -> ComputeGroup:
        return cls(group, _by_index(_on_node(gpus, group.get("node"))))

    @property
    def id(self) -> str:
        return str(self.document["id"])

    @property
    def devices(self) -> list[Mapping[str, Json]]:
        return list(self.document.get("devices") or [])

    @property
    def gpu_indices(self) -> list[int]:
        return sorted({d["index"] for d in self.devices})

    @property
    def resources(self) -> dict[str, Json]:
        """Counts a scheduler compares, plus the devices and the claim behind them."""
        return {
            "gpus": len(self.gpu_indices),
            "devices": self.devices,
            "memory_mib": sum(d.get("memory_mib") or 0 for d in self.devices),
            "compute_pct": sum(d.get("compute_pct") or 0 for d in self.devices),
            "claim": self.document.get("claim"),
        }

    @property
    def topology(self) -> dict[str, Json]:
        return {
            "gpu_indices": self.gpu_indices,
            "domain": self.document.get("domain"),
            "exclusive_domain": self.document.get("exclusive_domain"),
            "scope": self.document.get("scope"),
            "replica": self.document.get("replica"),
        }

    @property
    def utilization(self) -> dict[str, float | None]:
        """Allocated and measured use of the GPUs this group touches, at the time of the snapshot
        (keys in `_usage`)."""
        return _usage([self.gpu_status[i] for i in self.gpu_indices if i in self.gpu_status])

    @property
    def allocation_state(self) -> str:
        return str(self.document.get("state", "unknown"))

    @property
    def component(self) -> str | None:
        """The component that owns the group. cgd names a group made with
        `create_compute_group` after its user (`@1000`) and a reserved one
        after its reservation: neither is a component yet."""
        owner = self.document.get("owner")
        if not isinstance(owner, str) or owner.startswith("@") or self.allocation_state == "reserved":
            return None
        return owner

    @property
    def users(self) -> list[str]:
        """Every component attached to the group (sharers and shadows too)."""
        return list(self.document.get("users") or [])


@dataclass(frozen=True)
class ComputeNode:
    """One machine and the groups on it; cgd manages exactly one, a cluster one per GPU node."""

    machine: Mapping[str, Json]
    gpus: Sequence[Mapping[str, Json]]
    compute_groups: Sequence[ComputeGroup]

    def __post_init__(self) -> None:
        """Given a whole cluster's GPUs and groups, keep this node's (by their `node`)."""
        object.__setattr__(self, "gpus", _on_node(self.gpus, self.id))
        mine = {id(d) for d in _on_node([g.document for g in self.compute_groups], self.id)}
        object.__setattr__(self, "compute_groups", [g for g in self.compute_groups if id(g.document) in mine])

    @property
    def id(self) -> str:
        return str(self.machine.get("hostname") or "localhost")

    @property
    def resources(self) -> dict[str, Json]:
        models = Counter(g.get("name") or "unknown" for g in self.gpus)
        return {
            "gpus": len(self.gpus),
            "memory_mib": sum(g.get("memory_mib") or 0 for g in self.gpus),
            "models": dict(models),
            "devices": [{k: g.get(k) for k in ("index", "uuid", "name", "memory_mib", "health", "drained")}
                        for g in self.gpus],
        }

    @property
    def utilization(self) -> dict[str, float | None]:
        """Allocated and measured use over all its GPUs (keys in `_usage`)."""
        return _usage(self.gpus)
