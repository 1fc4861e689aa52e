"""Shares of one GPU and MIG instances: rank every device that can take it.

A share (DRA consumable capacity) never spans two devices, so the choice is a
ranking, not a search: binpack puts it on a GPU already shared where it costs
the fewest places for shares of the sizes now live, then where it leaves the
least memory over; spread where the GPU is least used. Which GPUs may be
shared at all, and how much a share takes, is decided here too.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from computegroups.daemon.model.claims import Claim, Strategy
from computegroups.daemon.placement.explain import IN_USE_WHOLE, MIG_TAKEN, NO_ROOM, domain_name, memory_text
from computegroups.daemon.placement.records import DeviceShare, DoesNotFitNow, Score
from computegroups.daemon.placement.rules import Rules, holders
from computegroups.daemon.placement.topo import Topo
from computegroups.daemon.placement.wholes import StageCosts
from computegroups.topology.model import MigDevice

MIX_SIZES = 8
"""The most common live share sizes binpack packs for: enough for a real mix, and a bound on the
decision's cost when every share asked a different size."""


@dataclass(frozen=True)
class DeviceChoice:
    key: tuple[int, ...]
    device: DeviceShare
    exclusive: frozenset[int] | None
    note: str


def share_size(rules: Rules, gpu: int) -> tuple[int, int]:
    """Memory and compute a share claim takes on this GPU (defaults filled in)."""
    claim = rules.claim
    memory = claim.memory_mib if claim.memory_mib is not None else rules.config.share_mib(rules.topo.memory[gpu])
    return memory, claim.compute_pct or 0


def may_use_mig(claim: Claim) -> bool:
    """A plain memory share may take a whole free MIG instance with at least that memory,
    when no GPU share fits (the ranking puts instances last)."""
    return claim.kind == "share" and claim.memory_mib is not None and claim.compute_pct is None


def share_options(rules: Rules, costs: StageCosts, reasons: dict[int, str]) -> list[DeviceChoice]:
    topo, claim = rules.topo, rules.claim
    found: list[DeviceChoice] = []
    mix = _common_sizes(rules) if rules.strategy is Strategy.BINPACK else ()

    def big_enough(m: MigDevice) -> bool:
        return (m.memory_mib or 0) >= (claim.memory_mib or 0)

    for g in rules.pool_gpus():
        if topo.mig[g]:
            if may_use_mig(claim):
                found += _mig_options(rules, costs, g, reasons, big_enough)
            else:
                reasons[g] = "MIG enabled (ask for a mig profile)"
            continue
        exclusive, refusal = _exclusive_domain(rules, g)
        why = rules.why_not(g) or _share_refusal(rules, g) or refusal
        if why is not None:
            reasons[g] = why
            continue
        memory, compute = share_size(rules, g)
        key = _share_key(rules, costs, g, memory, exclusive, mix)
        device = DeviceShare(gpu=g, mig_uuid=None, memory_mib=memory, compute_pct=compute, whole=False)
        found.append(DeviceChoice(key, device, exclusive, _share_note(rules, g, memory)))
    return found


def mig_options(rules: Rules, costs: StageCosts, reasons: dict[int, str]) -> list[DeviceChoice]:
    found: list[DeviceChoice] = []
    for g in rules.pool_gpus():
        if not rules.topo.mig[g]:
            continue
        found += _mig_options(rules, costs, g, reasons, lambda m: m.profile == rules.claim.mig)
    return found


def _mig_options(rules: Rules, costs: StageCosts, g: int, reasons: dict[int, str],
                 wanted: Callable[[MigDevice], bool]) -> list[DeviceChoice]:
    exclusive, refusal = _exclusive_domain(rules, g)
    why = rules.why_not(g) or refusal
    if why is not None:
        reasons[g] = why
        return []
    out = []
    for m in rules.topo.machine.gpu(g).mig_devices:
        if not wanted(m):
            continue
        if rules.mig_taken(m.uuid):
            reasons.setdefault(g, MIG_TAKEN)
            continue
        holder = rules.ledger.mig_holder.get(m.uuid)
        penalty = int(holder is not None) + len(rules.ledger.exclusive_on[g] & rules.ignore)
        used = len(rules.groups(g) - {holder} if holder else rules.groups(g))
        if rules.strategy is Strategy.BINPACK:
            rank: tuple[int, ...] = (int(used == 0), _fresh(rules.topo, costs, g), costs.fit[g])
        else:
            rank = (used,)
        # The smallest instance first: what a plain share leaves of it is wasted (a `mig`
        # claim's instances are all one size, so only the parent's rank orders them).
        key = (penalty, _size_key(rules, exclusive), 3, m.memory_mib or 0, *rank, g, m.index)
        device = DeviceShare(gpu=g, mig_uuid=m.uuid, memory_mib=m.memory_mib or 0, compute_pct=100, whole=True)
        note = f"MIG {m.profile} instance {m.index} on GPU {g}"
        out.append(DeviceChoice(key, device, exclusive, note))
    return out


def _share_refusal(rules: Rules, g: int) -> str | None:
    if rules.topo.memory[g] <= 0:
        return "memory size unknown"
    if rules.held_whole(g):
        return IN_USE_WHOLE
    memory, compute = share_size(rules, g)
    if rules.free_memory(g) < memory or rules.free_compute(g) < compute:
        return NO_ROOM
    return None


def _exclusive_domain(rules: Rules, g: int) -> tuple[frozenset[int] | None, str | None]:
    """The domain an exclusive claim would hold through GPU g, or why it can not."""
    kind = rules.claim.exclusive
    if kind is None:
        return None, None
    dom = rules.topo.domain_of(kind, g)
    if dom is None:
        return None, f"in no known {domain_name(kind)} (exclusive)"
    if not rules.domain_is_free(dom):
        return None, f"its {domain_name(kind)} is in use (exclusive)"
    return dom, None


def _fresh(topo: Topo, costs: StageCosts, g: int) -> int:
    return sum(costs.fresh[d] for d in topo.domains_of[g])


def _size_key(rules: Rules, exclusive: frozenset[int] | None) -> int:
    """An exclusive claim holds a whole domain: binpack the smallest, spread the largest."""
    size = len(exclusive) if exclusive else 0
    return size if rules.strategy is Strategy.BINPACK else -size


def _share_key(
    rules: Rules, costs: StageCosts, g: int, memory: int, exclusive: frozenset[int] | None,
    mix: tuple[int, ...],
) -> tuple[int, ...]:
    """binpack: a shared GPU first, where the share costs the fewest places for the shares now
    live (`_places_lost`), then the tightest fit; then an unused GPU where it breaks the fewest
    unused domains (and has the most room for the next shares); spread: the least used GPU (by
    the larger of memory and compute used), in the least used domains. A MIG instance (class 3)
    comes after every GPU share: carving a whole instance for a plain share wastes what the
    instance has over; a `mig` claim asks for one."""
    topo = rules.topo
    head = (rules.penalty(g), _size_key(rules, exclusive))
    if rules.strategy is Strategy.BINPACK:
        free = rules.free_memory(g)
        if rules.groups(g):
            lost = _places_lost(free, memory, {memory, *mix})
            return (*head, 0, lost, free - memory, _fresh(topo, costs, g), costs.fit[g], g, -1)
        return (*head, 2, _fresh(topo, costs, g), costs.fit[g], -free, g, -1)
    total = topo.memory[g]
    used = max((total - rules.free_memory(g)) * 1000 // total, (100 - rules.free_compute(g)) * 10)
    return (*head, 0, used, costs.fit[g], len(rules.groups(g)), g, -1)


def _common_sizes(rules: Rules) -> tuple[int, ...]:
    """The live share sizes to keep room for, besides the one asked: the `MIX_SIZES` most common."""
    live = rules.ledger.share_sizes
    return tuple(heapq.nsmallest(MIX_SIZES, live, key=lambda size: (-live[size], size)))


def _places_lost(free: int, memory: int, sizes: set[int]) -> int:
    """How many shares of those sizes this GPU could take, less what it could after this one.

    Best fit alone would take 1 GiB from a GPU with 8 GiB free rather than from one with 9,
    leaving 7 and 9 where 8 and 8 still take two 8 GiB shares: over a trace of releases and
    arrivals the free memory stays in pieces the live shares fit (benchmarks/allocator.py).
    """
    return sum(free // size - (free - memory) // size for size in sizes if size > 0)


def _share_note(rules: Rules, g: int, memory: int) -> str:
    others = len(rules.groups(g))
    left = rules.free_memory(g) - memory
    with_whom = f"shared with {others} other group{'s' if others != 1 else ''}" if others else "an unused GPU"
    return f"{with_whom}, {memory_text(left)} left free"


def device_score(choice: DeviceChoice, strategy: Strategy, total_mib: int) -> Score:
    d = choice.device
    if d.mig_uuid is not None:
        text = f"{choice.note} ({memory_text(d.memory_mib)})"
    else:
        text = (f"GPU {d.gpu}: {memory_text(d.memory_mib)} of {memory_text(total_mib)}, {d.compute_pct}% compute; "
                f"{choice.note}")
    text += f" ({strategy.value})"
    return Score(nvlinks=0, pcie=0, explanation=text)


def share_failure(rules: Rules, options_reasons: dict[int, str]) -> DoesNotFitNow:
    claim = rules.claim
    if claim.kind == "mig":
        what = f"a free MIG {claim.mig} instance"
    else:
        sizes = sorted({share_size(rules, g)[0] for g in rules.pool_gpus() if not rules.topo.mig[g]})
        memory = memory_text(sizes[0]) if len(sizes) == 1 else \
            f"{memory_text(sizes[0])}-{memory_text(sizes[-1])}" if sizes else "memory"
        what = f"{memory}{f' and {claim.compute_pct}% compute' if claim.compute_pct else ''} on one GPU"
    text = f"needs {what}; none is free now"
    roomiest = _roomiest(rules)
    if roomiest and claim.kind == "share":
        text += f"; the most free is {roomiest}"
    return DoesNotFitNow(text, options_reasons, label="not usable", holders=holders(rules, options_reasons))


def _roomiest(rules: Rules) -> str | None:
    gpus = [g for g in rules.pool_gpus() if not rules.topo.mig[g] and not rules.held_whole(g)
            and rules.why_not(g) is None]
    if not gpus:
        return None
    g = max(gpus, key=lambda x: (rules.free_memory(x), -x))
    return f"{memory_text(max(0, rules.free_memory(g)))} and {max(0, rules.free_compute(g))}% compute on GPU {g}"
