"""Which devices one claim may use right now, and in words why not the others.

A `Rules` is built for one decision. It can look at the ledger as if some
holdings were gone (the reservations a higher-priority claim may displace),
so the same checks serve the normal pass and the displacing pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from computegroups.daemon.model.claims import AffinityTerm, AllocatorConfig, Claim, Strategy
from computegroups.daemon.placement.explain import HELD, HELD_EXCLUSIVELY, UNAVAILABLE, domain_name
from computegroups.daemon.placement.ledger import Ledger
from computegroups.daemon.placement.records import Holding
from computegroups.daemon.placement.selectors import selected
from computegroups.daemon.placement.topo import Topo


class Rules:
    def __init__(self, topo: Topo, ledger: Ledger, config: AllocatorConfig, claim: Claim,
                 avoid: Iterable[int] = (), ignore: Iterable[str] = ()) -> None:
        self.topo = topo
        self.ledger = ledger
        self.config = config
        self.claim = claim
        self.strategy: Strategy = claim.strategy or config.default_strategy
        """The claim's strategy, or the operator's default when it names none."""
        self.avoid = frozenset(avoid)
        self.ignore = frozenset(ignore)
        self._freed_memory: dict[int, int] = {}
        self._freed_compute: dict[int, int] = {}
        self._freed_whole: dict[int, int] = {}
        for gid in sorted(self.ignore):
            self._forget(ledger.holdings[gid])
        self.near = [(t, self._near(t)) for t in claim.affinity]
        self.far = [(t, self._near(t)) for t in claim.anti_affinity]

    def _forget(self, h: Holding) -> None:
        for d in h.devices:
            if d.mig_uuid is None and d.gpu in self.ledger.total:
                self._freed_memory[d.gpu] = self._freed_memory.get(d.gpu, 0) + d.memory_mib
                self._freed_compute[d.gpu] = self._freed_compute.get(d.gpu, 0) + d.compute_pct
                self._freed_whole[d.gpu] = self._freed_whole.get(d.gpu, 0) + d.whole

    def _near(self, term: AffinityTerm) -> frozenset[int]:
        """The GPUs that count as "with" a component at the term's level."""
        gpus = self.ledger.gpus_of(term.component)
        kind = term.domain_kind
        if kind is None:
            return frozenset(gpus)
        near: set[int] = set()
        for g in gpus:
            dom = self.topo.domain_of(kind, g)
            near |= dom if dom is not None else {g}
        return frozenset(near)

    def pool_gpus(self) -> tuple[int, ...]:
        """The GPUs the claim may ever use, before looking at what is in use."""
        gpus = set(self.topo.gpus)
        if self.claim.pool is not None:
            gpus &= self.config.pools.get(self.claim.pool, frozenset())
        if self.claim.gpu_ids is not None:
            gpus &= set(self.claim.gpu_ids)
        chosen = selected(self.topo.machine, self.claim)
        if chosen is not None:
            gpus &= chosen
        return tuple(sorted(gpus))

    def groups(self, gpu: int) -> set[str]:
        return self.ledger.groups_on[gpu] - self.ignore

    def exclusive_owners(self, gpu: int) -> set[str]:
        return self.ledger.exclusive_on[gpu] - self.ignore

    def free_memory(self, gpu: int) -> int:
        return self.ledger.free_memory(gpu) + self._freed_memory.get(gpu, 0)

    def free_compute(self, gpu: int) -> int:
        return self.ledger.free_compute(gpu) + self._freed_compute.get(gpu, 0)

    def held_whole(self, gpu: int) -> bool:
        return self.ledger.whole_on[gpu] - self._freed_whole.get(gpu, 0) > 0

    def mig_taken(self, uuid: str) -> bool:
        holder = self.ledger.mig_holder.get(uuid)
        return holder is not None and holder not in self.ignore

    def penalty(self, gpu: int) -> int:
        """Reserved groups that would have to go for this GPU to be used."""
        if not self.ignore:
            return 0
        return len((self.ledger.groups_on[gpu] | self.ledger.exclusive_on[gpu]) & self.ignore)

    def domain_is_free(self, dom: frozenset[int]) -> bool:
        """No group in it and none holding it: an exclusive claim may take it."""
        return all(not self.groups(g) and not self.exclusive_owners(g) for g in dom)

    def why_not(self, gpu: int) -> str | None:
        """The first rule, common to every kind of claim, that keeps this GPU out."""
        if gpu in self.avoid:
            return "taken by an earlier group of this request"
        if gpu in self.ledger.unavailable:
            return UNAVAILABLE
        if self.exclusive_owners(gpu):
            return HELD_EXCLUSIVELY
        for term, near in self.near:
            if gpu not in near:
                return f"not {_level(term)} {term.component} (affinity)"
        for term, near in self.far:
            if gpu in near:
                return f"{_level(term)} {term.component} (anti-affinity)"
        return None


def holders(rules: Rules, reasons: Mapping[int, str]) -> dict[int, frozenset[str]]:
    """For each GPU whose reason is another group's use of it (`explain.HELD`), the groups there."""
    out = {}
    for gpu, why in reasons.items():
        held = frozenset(rules.groups(gpu) | rules.exclusive_owners(gpu)) if why in HELD else frozenset()
        if held:
            out[gpu] = held
    return out


def _level(term: AffinityTerm) -> str:
    kind = term.domain_kind
    return "on the same GPU as" if kind is None else f"in the same {domain_name(kind)} as"
