"""The machine as the placement objective sees it, computed once per allocator.

Links, models, NUMA nodes, NVLink islands, the domains a set can touch and
which GPUs are twins all depend on the machine alone, so they are worked out here at start-up and every
decision only reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from math import comb

from computegroups.topology.model import DomainKind, Machine, PcieLevel

PLACEMENT_KINDS = (DomainKind.NVLINK, DomainKind.PCIE, DomainKind.NUMA)

CLOSENESS = {
    PcieLevel.INTERNAL: 5,
    PcieLevel.SINGLE: 4,
    PcieLevel.MULTIPLE: 3,
    PcieLevel.HOSTBRIDGE: 2,
    PcieLevel.NODE: 1,
    PcieLevel.SYSTEM: 0,
}


class Topo:
    """Static facts the objective reads: links, models, NUMA nodes, islands, twins.

    Whole-GPU sets are ranked by a tuple of keys (`daemon/placement/wholes.py`);
    the part of it the branch-and-bound search maximises is additive and is
    one integer here: minus the displaced reservations, minus the GPU models
    and the NUMA nodes the set touches, plus its NVLink sum. Each part is
    scaled past the largest total the parts below it can reach.
    """

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.gpus = tuple(sorted(machine.indices))
        self.n = len(self.gpus)
        self.pos = {g: i for i, g in enumerate(self.gpus)}
        self.mig = {g.index: bool(g.mig_enabled) or bool(g.mig_devices) for g in machine.gpus}
        self.memory = {g.index: g.memory_mib or 0 for g in machine.gpus}
        self.model = {g.index: g.name for g in machine.gpus}
        self.numa = {g.index: g.numa_node for g in machine.gpus}
        self.nv = {a: {b: machine.nvlinks(a, b) for b in self.gpus if b != a} for a in self.gpus}
        self.close = {a: {b: _closeness(machine, a, b) for b in self.gpus if b != a} for a in self.gpus}
        self.adj = {a: frozenset(b for b, links in self.nv[a].items() if links) for a in self.gpus}
        self.islands = tuple(machine.nvlink_islands)
        self.island_of = {g: island for island in self.islands for g in island}
        largest = max((len(i) for i in self.islands), default=0)
        self.lookahead_sizes = tuple(sorted({k for k in (2, 4, 8, largest) if 2 <= k <= largest}, reverse=True))
        """The set sizes what is left is judged by: 2, 4, 8 and the largest island."""
        models = sorted(set(self.model.values()))
        nodes = sorted({n for n in self.numa.values() if n is not None})
        self.model_domain = {g: models.index(self.model[g]) for g in self.gpus}
        self.numa_domain = {g: len(models) + nodes.index(node) for g in self.gpus
                            if (node := self.numa[g]) is not None}
        max_nv = max((self.nv[a][b] for a in self.gpus for b in self.gpus if a < b), default=0)
        self.r_numa = comb(self.n, 2) * max_nv + 1
        self.r_model = self.r_numa * (len(nodes) + 1)
        self.r_penalty = self.r_model * (len(models) + 1)
        self.domain_cost = {**{d: self.r_model for d in range(len(models))},
                            **{len(models) + i: self.r_numa for i in range(len(nodes))}}
        self.domains = {kind: _domains(machine, kind) for kind in DomainKind}
        self.domain_list, self.domains_of = self._placement_domains()
        self.nv_twin = self._twins(lambda g: (), lambda a, x: self.nv[a][x])
        """Twins by NVLinks alone: what is left is judged by NVLinks alone."""
        self.twin = self._twins(
            lambda g: (self.domains_of[g], self.mig[g], self.memory[g], self.model[g], self.numa[g]),
            lambda a, x: (self.nv[a][x], self.close[a][x]))

    def key_domains(self, gpu: int) -> tuple[int, ...]:
        """The model and NUMA node of a GPU, as the search's domains (each costs once per set)."""
        numa = self.numa_domain.get(gpu)
        return (self.model_domain[gpu],) if numa is None else (self.model_domain[gpu], numa)

    def domain_of(self, kind: DomainKind, gpu: int) -> frozenset[int] | None:
        for dom in self.domains[kind]:
            if gpu in dom:
                return dom
        return None

    def _placement_domains(self) -> tuple[list[frozenset[int]], dict[int, tuple[int, ...]]]:
        """The domains a set can break into: islands, switches, NUMA nodes, each once."""
        found: list[frozenset[int]] = []
        for kind in PLACEMENT_KINDS:
            for dom in self.domains[kind]:
                if len(dom) > 1 and dom not in found:
                    found.append(dom)
        of = {g: tuple(i for i, dom in enumerate(found) if g in dom) for g in self.gpus}
        return found, of

    def _twins(self, own: Callable[[int], Hashable], link: Callable[[int, int], Hashable]) -> dict[int, int]:
        """Twin class per GPU: the same `own` facts and the same `link` to every other GPU."""
        reps: dict[tuple[object, ...], list[int]] = {}
        twin: dict[int, int] = {}
        for g in self.gpus:
            sig = (own(g), tuple(sorted(map(repr, (link(g, x) for x in self.gpus if x != g)))))
            candidates = reps.setdefault(sig, [])
            for rep in candidates:
                if all(link(g, x) == link(rep, x) for x in self.gpus if x not in (g, rep)):
                    twin[g] = rep
                    break
            else:
                candidates.append(g)
                twin[g] = g
        return twin


def _closeness(machine: Machine, a: int, b: int) -> int:
    level = machine.link(a, b).pcie
    return CLOSENESS[level] if level is not None else 0


def _domains(machine: Machine, kind: DomainKind) -> tuple[frozenset[int], ...]:
    """The model's domains, less the pseudo NUMA node of GPUs whose node is unknown."""
    if kind is DomainKind.NUMA:
        known = sorted((k, v) for k, v in machine.gpus_by_numa.items() if k is not None)
        return tuple(frozenset(v) for _, v in known)
    return machine.domains(kind)
