"""The wait queue's decisions: who goes first, and who may go around the head.

Pure: the state and a scratch allocator in, an order or a time out. Claims
are placed in priority order, first come first served within a priority
(Slurm's and Kubernetes' order). A later claim may start before the head of
the queue only when, by the time limits, it ends before the head could
start (EASY backfill, as Slurm does it): so a large claim at the head is
never starved by a stream of small ones, and a claim without a time limit
is never backfilled.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from computegroups.daemon.model.claims import Claim
from computegroups.daemon.model.config import DaemonConfig
from computegroups.daemon.model.enums import ComponentState
from computegroups.daemon.placement import choices
from computegroups.daemon.placement.allocator import Allocator, DoesNotFitNow, Holding, NeverFits
from computegroups.statefiles.schema import ComponentRecord, StateDoc
from computegroups.topology.model import Machine

FINISHED = frozenset({ComponentState.COMPLETED, ComponentState.FAILED, ComponentState.TIMEOUT})
"""A component in one of these states runs nothing and holds nothing of its own any more."""


def priority(comp: ComponentRecord) -> int:
    return comp.spec.claim.priority if comp.spec.claim is not None else 0


def queue_order(doc: StateDoc) -> list[ComponentRecord]:
    """The pending components, the head first."""
    pending = (c for c in doc.components.values() if c.state == ComponentState.PENDING)
    return sorted(pending, key=lambda c: (-priority(c), c.queued_at or 0.0, c.name))


def ahead_of(doc: StateDoc, claim_priority: int) -> list[ComponentRecord]:
    """The queued components a new claim of this priority must let go first."""
    return [c for c in queue_order(doc) if priority(c) >= claim_priority]


def ends_at(comp: ComponentRecord) -> float:
    """When a running component will have ended at the latest: its time limit; never without one."""
    limit = comp.spec.time_limit_s
    return math.inf if limit is None else comp.created + limit


def head_start(machine: Machine, config: DaemonConfig, holdings: Iterable[Holding], doc: StateDoc,
               unavailable: set[int], foreign: dict[int, int], head: ComponentRecord, now: float) -> float:
    """The earliest time the head's claim fits, if every component ends at its time limit.

    The components with a limit are let go one by one, soonest end first,
    on a scratch allocator, until the head fits; infinity when it does not
    fit even then (it waits on something without a limit).
    """
    claim = head.spec.claim
    assert claim is not None
    scratch = Allocator(machine, config.allocator)
    held = {h.group_id: h for h in holdings}
    scratch.follow(held)
    scratch.set_unavailable(unavailable)
    scratch.set_foreign(foreign)
    if _fits(scratch, claim, head):
        return now
    timed = sorted((ends_at(c), c.name) for c in doc.components.values()
                   if c.state not in FINISHED and c.state != ComponentState.PENDING
                   and c.spec.time_limit_s is not None)
    for end, name in timed:
        gone: dict[str, Holding | None] = {
            gid: None for gid, h in held.items() if h.users == {name} or (h.owner == name and not h.users)}
        for gid in gone:
            held.pop(gid)
        scratch.update(gone)
        if _fits(scratch, claim, head):
            return max(end, now)
    return math.inf


def may_backfill(comp_limit: float | None, now: float, head_at: float) -> bool:
    """A claim that fits now may go before the head only if it is sure to end before the head can start."""
    return comp_limit is not None and now + comp_limit <= head_at


def _fits(scratch: Allocator, claim: Claim, comp: ComponentRecord) -> bool:
    ids = [f"{comp.name}-{i}" for i in range(comp.replicas)] if comp.spec.scope == "per-replica" \
        else [f"{comp.name}-all"]
    try:
        choices.place(scratch, claim, ids, comp.name)
    except (DoesNotFitNow, NeverFits, ValueError):
        return False
    for gid in ids:
        scratch.release(gid)
    return True

