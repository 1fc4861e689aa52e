"""Pure placement: the machine, what is in use and a claim in; devices out.

No I/O and no clock: the same calls in the same order give the same answers,
so the manager can replay them, tests can compare them with brute force, and a
restarted daemon rebuilds the same state from its holdings. The objective and
the rules are in `docs/placement.md`; the parts live in `daemon/placement/`.
"""

from __future__ import annotations

from collections.abc import Iterable, KeysView, Mapping, Sequence
from dataclasses import replace

from computegroups.daemon.model.claims import AllocatorConfig, Claim
from computegroups.daemon.placement import shares, wholes
from computegroups.daemon.placement.cpus import check_cpus, cpu_placement
from computegroups.daemon.placement.explain import IN_USE
from computegroups.daemon.placement.feasible import check_ever
from computegroups.daemon.placement.ledger import Ledger
from computegroups.daemon.placement.lookahead import Lookahead
from computegroups.daemon.placement.records import (
    DeviceShare,
    DoesNotFitNow,
    GpuUse,
    Holding,
    NeverFits,
    Placement,
    PlacementError,
    Score,
)
from computegroups.daemon.placement.rules import Rules
from computegroups.daemon.placement.search import Problem, best_subset
from computegroups.daemon.placement.topo import Topo
from computegroups.topology.model import Machine

__all__ = [
    "Allocator", "DeviceShare", "DoesNotFitNow", "GpuUse", "Holding", "NeverFits", "Placement",
    "PlacementError", "Score",
]


_DEFAULT_CONFIG = AllocatorConfig()


class Allocator:
    """Owns the free/used state of one machine and decides placements."""

    def __init__(self, machine: Machine, config: AllocatorConfig = _DEFAULT_CONFIG) -> None:
        self.machine = machine
        self.config = config
        self.topo = Topo(machine)
        self.ledger = Ledger(machine)
        self.look = Lookahead(self.topo)
        self._best_nvlinks: dict[tuple[int, tuple[int, ...]], int] = {}

    def allocate(self, claim: Claim, group_ids: Sequence[str], owner: str, *,
                 reserved: bool = False) -> tuple[Placement, ...]:
        """Place one group per id, all or nothing; a failure leaves the state as it was."""
        ids = list(group_ids)
        if len(set(ids)) != len(ids):
            raise ValueError("a group id is given twice")
        live = [gid for gid in ids if gid in self.ledger.holdings]
        if live:
            raise ValueError(f"group {live[0]!r} is already placed")
        check_cpus(self.ledger, claim, len(ids))
        if claim.kind != "cpu":
            check_ever(self.topo, self.config, claim, len(ids))
        undo: list[tuple[str, Holding]] = []
        placements: list[Placement] = []
        avoid: set[int] = set()
        try:
            for gid in ids:
                placement = self._place_one(claim, gid, owner, reserved, avoid, undo)
                placements.append(placement)
                if claim.distinct:
                    avoid |= {d.gpu for d in placement.devices}
        except PlacementError as exc:
            self._undo(undo)
            if len(ids) > 1:
                note = f" (group {len(placements) + 1} of {len(ids)}; the groups are placed all or nothing)"
                raise (exc.noted(note) if isinstance(exc, DoesNotFitNow) else type(exc)(f"{exc}{note}")) from None
            raise
        return tuple(placements)

    def release(self, group_id: str) -> None:
        if group_id not in self.ledger.holdings:
            raise KeyError(f"no live group {group_id!r}")
        self.ledger.remove(group_id)

    def follow(self, holdings: Mapping[str, Holding]) -> None:
        """Hold exactly `holdings` from now on, touching only the groups that differ.

        The ledger is a view of the caller's record of what is in use (cgd's
        state document), never a second truth: the caller passes the holdings
        derived from that record before each decision and at each commit, so a
        change made anywhere (a new group's users, a reservation taken, another
        process's commit) is seen by the next decision. Input past capacity
        (the machine changed under the record) is counted, not refused.
        """
        gone: dict[str, Holding | None] = {gid: None for gid in self.ledger.holdings.keys() - holdings.keys()}
        self.update({**gone, **holdings})

    def update(self, changes: Mapping[str, Holding | None]) -> None:
        """Hold each changed group as given from now on (None: not at all); the others stay as they are.

        `follow` for a caller that knows what changed since the last call, so
        a decision on a large state does not pay for the groups nobody touched.
        """
        ledger = self.ledger
        for gid, h in changes.items():
            have = ledger.holdings.get(gid)
            if have == h:
                continue
            if have is not None:
                ledger.remove(gid)
            if h is not None:
                ledger.add(h)

    def held_ids(self) -> KeysView[str]:
        """The ids of the groups held now (a live view)."""
        return self.ledger.holdings.keys()

    def holdings(self) -> tuple[Holding, ...]:
        return tuple(self.ledger.holdings[gid] for gid in sorted(self.ledger.holdings))

    def set_unavailable(self, gpus: Iterable[int]) -> None:
        """Draining or unhealthy GPUs: what is on them stays, nothing new goes there."""
        self.ledger.set_unavailable(gpus)

    def set_foreign(self, memory_by_gpu: Mapping[int, int]) -> None:
        """MiB used by processes cgd does not own, as NVML last saw them (replaces the last call)."""
        self.ledger.set_foreign(memory_by_gpu)

    def free_summary(self) -> tuple[GpuUse, ...]:
        """Per GPU, what is left and who is there: for status pages and error messages."""
        led = self.ledger
        return tuple(
            GpuUse(
                gpu=g, memory_mib=led.total[g], memory_free_mib=max(0, led.free_memory(g)),
                memory_foreign_mib=led.foreign.get(g, 0), compute_free_pct=max(0, led.free_compute(g)),
                whole_free=not led.groups_on[g] and not self.topo.mig[g] and not led.exclusive_on[g]
                and g not in led.unavailable and not led.foreign.get(g),
                available=g not in led.unavailable, mig=self.topo.mig[g],
                groups=tuple(sorted(led.groups_on[g])),
                exclusive_group=min(led.exclusive_on[g]) if led.exclusive_on[g] else None,
            )
            for g in self.topo.gpus
        )

    def _place_one(self, claim: Claim, gid: str, owner: str, reserved: bool, avoid: set[int],
                   undo: list[tuple[str, Holding]]) -> Placement:
        displaced: list[str] = []
        if claim.kind == "cpu":
            holding = Holding(group_id=gid, devices=(), owner=owner, priority=claim.priority,
                              reserved=reserved, cpus=claim.cpus or 0)
            self.ledger.add(holding)
            undo.append(("added", holding))
            return cpu_placement(claim, gid)
        try:
            placement = self._decide(Rules(self.topo, self.ledger, self.config, claim, avoid), gid)
        except DoesNotFitNow as first:
            victims = self._victims(claim, gid, avoid)
            if not victims:
                raise first from None
            for victim in victims:
                undo.append(("removed", self.ledger.remove(victim)))
                displaced.append(victim)
            placement = self._decide(Rules(self.topo, self.ledger, self.config, claim, avoid), gid)
        holding = Holding(group_id=gid, devices=placement.devices, owner=owner, users=frozenset(),
                          exclusive_domain=placement.exclusive_domain, priority=claim.priority,
                          reserved=reserved, cpus=claim.cpus or 0)
        self.ledger.add(holding)
        undo.append(("added", holding))
        return replace(placement, displaced=tuple(displaced))

    def _undo(self, undo: list[tuple[str, Holding]]) -> None:
        for action, holding in reversed(undo):
            if action == "added":
                self.ledger.remove(holding.group_id)
            else:
                self.ledger.add(holding)

    def _victims(self, claim: Claim, gid: str, avoid: set[int]) -> list[str]:
        """The reservations to displace, found by placing as if every displaceable one were gone."""
        movable = sorted(g for g, h in self.ledger.holdings.items()
                         if h.reserved and h.priority < claim.priority)
        if not movable:
            return []
        rules = Rules(self.topo, self.ledger, self.config, claim, avoid, ignore=movable)
        try:
            placement = self._decide(rules, gid)
        except DoesNotFitNow:
            return []
        return _needed(self.ledger, rules, placement, set(movable))

    def _decide(self, rules: Rules, gid: str) -> Placement:
        if rules.claim.kind == "whole":
            return self._decide_whole(rules, gid)
        return self._decide_device(rules, gid)

    def _decide_whole(self, rules: Rules, gid: str) -> Placement:
        claim, topo = rules.claim, self.topo
        n = claim.gpus or 1
        reasons: dict[int, str] = {}
        free: list[int] = []
        for g in rules.pool_gpus():
            why = "MIG enabled" if topo.mig[g] else rules.why_not(g) or _busy(rules, g)
            if why is None:
                free.append(g)
            else:
                reasons[g] = why
        found = wholes.regions(topo, rules, claim, free)
        costs = wholes.stage_costs(topo, rules, rules.strategy)
        choice = wholes.best_set(topo, rules, costs, self.look, found, n)
        if choice is None:
            raise wholes.failure(topo, rules, claim, free, reasons)
        score = wholes.set_score(topo, self.look, choice, self._best_possible(rules, n),
                                 wholes.spare_gpus(topo, rules), n)
        devices = tuple(DeviceShare(gpu=g, mig_uuid=None, memory_mib=topo.memory[g], compute_pct=100,
                                    whole=True) for g in choice.gpus)
        region = choice.region
        return Placement(group_id=gid, devices=devices, domain=region.colocate or region.exclusive,
                         exclusive_domain=region.exclusive, score=score)

    def _decide_device(self, rules: Rules, gid: str) -> Placement:
        costs = wholes.stage_costs(self.topo, rules, rules.strategy)
        reasons: dict[int, str] = {}
        if rules.claim.kind == "mig":
            options = shares.mig_options(rules, costs, reasons)
        else:
            options = shares.share_options(rules, costs, reasons)
        if not options:
            raise shares.share_failure(rules, reasons)
        best = min(options, key=lambda o: o.key)
        score = shares.device_score(best, rules.strategy, self.topo.memory[best.device.gpu])
        return Placement(group_id=gid, devices=(best.device,), domain=best.exclusive,
                         exclusive_domain=best.exclusive, score=score)

    def _best_possible(self, rules: Rules, n: int) -> int:
        """Most NVLinks any n GPUs of the claim's scope have, on the empty machine (for explanations)."""
        scope = tuple(g for g in rules.pool_gpus() if not self.topo.mig[g])
        key = (n, scope)
        if key not in self._best_nvlinks:
            topo = self.topo
            weight = [[topo.nv[a][b] if a != b else 0 for b in scope] for a in scope]
            problem = Problem(weight, [0] * len(scope), [()] * len(scope), {}, [topo.nv_twin[g] for g in scope])
            answer = best_subset(problem, n)
            self._best_nvlinks[key] = answer.value if answer else 0
        return self._best_nvlinks[key]


def _busy(rules: Rules, gpu: int) -> str | None:
    if rules.groups(gpu):
        return IN_USE
    if rules.ledger.foreign.get(gpu) and not rules.claim.allow_busy:
        return "has processes cgd does not own (allow_busy to use it)"
    return None


def _needed(ledger: Ledger, rules: Rules, placement: Placement, movable: set[str]) -> list[str]:
    """Of the displaceable holdings, those in the way of this placement."""
    gpus = {d.gpu for d in placement.devices}
    zone = gpus | set(placement.exclusive_domain or ())
    victims = {gid for g in zone for gid in ledger.exclusive_on[g] & movable}
    if placement.exclusive_domain:
        victims |= {gid for g in placement.exclusive_domain for gid in ledger.groups_on[g] & movable}
    for d in placement.devices:
        if d.whole and d.mig_uuid is None:
            victims |= ledger.groups_on[d.gpu] & movable
        elif d.mig_uuid is not None:
            holder = ledger.mig_holder.get(d.mig_uuid)
            if holder in movable:
                victims.add(holder)
        else:
            victims |= _share_victims(ledger, rules, d, movable - victims)
    return sorted(victims)


def _share_victims(ledger: Ledger, rules: Rules, d: DeviceShare, movable: set[str]) -> set[str]:
    """Lowest priority first, only until the share fits."""
    memory = ledger.free_memory(d.gpu)
    compute = ledger.free_compute(d.gpu)
    whole = ledger.whole_on[d.gpu]
    out: set[str] = set()
    on_gpu = sorted(ledger.groups_on[d.gpu] & movable, key=lambda g: (ledger.holdings[g].priority, g))
    for gid in on_gpu:
        if memory >= d.memory_mib and compute >= d.compute_pct and whole <= 0:
            break
        out.add(gid)
        for dev in ledger.holdings[gid].devices:
            if dev.gpu == d.gpu and dev.mig_uuid is None:
                memory += dev.memory_mib
                compute += dev.compute_pct
                whole -= dev.whole
    return out
