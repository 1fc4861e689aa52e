"""Words for people: GPU lists, domain names, and why a claim did not fit.

Every refusal names what is missing ("needs 4 NVLink-colocated GPUs; the
largest free NVLink island has 3: GPUs 5,6,7"), so a user can act on it
without reading the allocator.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from computegroups.topology.model import DomainKind

DOMAIN_NAMES = {
    DomainKind.NVLINK: ("NVLink island", "NVLink islands", "NVLink-colocated"),
    DomainKind.PCIE: ("PCIe switch", "PCIe switches", "PCIe-switch-colocated"),
    DomainKind.NUMA: ("NUMA node", "NUMA nodes", "NUMA-colocated"),
    DomainKind.MACHINE: ("machine", "machines", "colocated"),
}


def gpu_list(gpus: Iterable[int]) -> str:
    """`0-3,5,7`: runs of consecutive indices folded."""
    ordered = sorted(set(gpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if j == i else f"{ordered[i]},{ordered[j]}" if j == i + 1
                     else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def gpus_phrase(gpus: Iterable[int]) -> str:
    ordered = sorted(set(gpus))
    if not ordered:
        return "no GPU"
    return f"GPU {ordered[0]}" if len(ordered) == 1 else f"GPUs {gpu_list(ordered)}"


def domain_name(kind: DomainKind, plural: bool = False) -> str:
    return DOMAIN_NAMES[kind][1 if plural else 0]


def colocated(kind: DomainKind) -> str:
    return DOMAIN_NAMES[kind][2]


IN_USE = "in use"
IN_USE_WHOLE = "in use as a whole GPU"
NO_ROOM = "not enough free memory or compute"
HELD_EXCLUSIVELY = "inside a domain another group holds exclusively"
MIG_TAKEN = "its matching MIG instances are taken"
UNAVAILABLE = "draining or unhealthy"
"""The ledger's unavailable GPUs, whatever the cause: the core, which knows it, words it (see
`StateKeeper.unavailable_reasons`)."""
HELD = frozenset({IN_USE, IN_USE_WHOLE, NO_ROOM, HELD_EXCLUSIVELY, MIG_TAKEN})
"""The reasons a GPU cannot be used that are other groups' doing: a refusal names their holders."""


def reasons_text(reasons: Mapping[int, str]) -> str:
    """`held by a group: 0-3; draining: 4`: the GPUs that were not free, by why."""
    by_reason: dict[str, list[int]] = {}
    for gpu, why in reasons.items():
        by_reason.setdefault(why, []).append(gpu)
    ordered = sorted(by_reason.items(), key=lambda kv: min(kv[1]))
    return "; ".join(f"{why}: {gpus_phrase(gpus)}" for why, gpus in ordered)


def memory_text(value: int) -> str:
    """In GiB, the unit a claim is written in (`--memory 20GiB`), so one message never mixes units:
    whole GiB as such, others to a hundredth, cut rather than rounded (7.99 GiB free does not take
    8 GiB)."""
    if value % 1024 == 0:
        return f"{value // 1024} GiB"
    return f"{value * 100 // 1024 / 100:.2f} GiB"
