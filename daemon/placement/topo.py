"""The machine as the placement objective sees it, computed once per allocator.

Pair weights, the domains a set can touch, and which GPUs are twins all
depend on the machine alone, so they are worked out here at start-up and every
decision only reads them.
"""

from __future__ import annotations

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
MAX_CLOSENESS = 5


class Topo:
    """Static facts and the radices that make the objective one integer.

    A set's value is, from the most to the least significant part: minus the
    reserved GPUs it displaces, its pair sum (NVLinks, then PCIe closeness),
    minus the fresh domains it breaks into, minus its fit cost, plus a term
    that prefers lower indices. Each part is scaled past the largest total
    the parts below it can reach, so comparing integers compares these parts
    in order.
    """

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.gpus = tuple(sorted(machine.indices))
        self.n = len(self.gpus)
        self.pos = {g: i for i, g in enumerate(self.gpus)}
        self.mig = {g.index: bool(g.mig_enabled) or bool(g.mig_devices) for g in machine.gpus}
        self.memory = {g.index: g.memory_mib or 0 for g in machine.gpus}
        self.nv = {a: {b: machine.nvlinks(a, b) for b in self.gpus if b != a} for a in self.gpus}
        self.close = {a: {b: _closeness(machine, a, b) for b in self.gpus if b != a} for a in self.gpus}
        pairs = comb(self.n, 2)
        self.nv_scale = MAX_CLOSENESS * pairs + 1
        max_pair = max((self.pair(a, b) for a in self.gpus for b in self.gpus if a < b), default=0)
        self.r_fit = 1 << self.n
        self.r_fresh = self.r_fit * (3 * self.n * self.n + 1)
        self.r_pair = self.r_fresh * (3 * self.n + 1)
        self.r_penalty = self.r_pair * (pairs * max_pair + 1)
        self.weight_rows = {
            a: [self.pair(a, b) * self.r_pair if b != a else 0 for b in self.gpus] for a in self.gpus
        }
        self.domains = {kind: _domains(machine, kind) for kind in DomainKind}
        self.domain_list, self.domains_of = self._placement_domains()
        self.twin = self._twins()

    def pair(self, a: int, b: int) -> int:
        """NVLinks first, PCIe closeness as the tie-breaker, in one number."""
        return self.nv[a][b] * self.nv_scale + self.close[a][b]

    def index_bonus(self, gpu: int) -> int:
        """Lower indices win the last tie: any set holding a lower index beats one without."""
        return 1 << (self.n - 1 - self.pos[gpu])

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

    def _twins(self) -> dict[int, int]:
        """Twin class per GPU: same links to every other GPU, same domains, same MIG state."""
        reps: dict[tuple[object, ...], list[int]] = {}
        twin: dict[int, int] = {}
        for g in self.gpus:
            sig = (self.domains_of[g], self.mig[g], self.memory[g],
                   tuple(sorted(self.weight_rows[g])))
            candidates = reps.setdefault(sig, [])
            for rep in candidates:
                if all(self.weight_rows[g][self.pos[x]] == self.weight_rows[rep][self.pos[x]]
                       for x in self.gpus if x not in (g, rep)):
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
