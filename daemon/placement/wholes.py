"""Whole GPUs: the best set of n free GPUs, one search per admissible region.

A region is where the whole set must lie: anywhere, one colocation domain, or
one unused domain to hold exclusively. The objective (`set_key`, in the
order of docs/placement.md) is the same in every region, so the best region
is simply the largest key. Its additive head (displaced reservations, GPU
models and NUMA nodes touched, NVLink sum) is searched by branch and bound,
inside the parts of the free GPUs connected over NVLink when one can hold
the set (connected first); every set that ties on it is then ranked by the
rest: the weakest pair, what it leaves for later, PCIe closeness, the
strategy, the lowest indices.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from computegroups.daemon.model.claims import Claim, Strategy
from computegroups.daemon.model.words import plural
from computegroups.daemon.placement.explain import colocated, domain_name, gpus_phrase
from computegroups.daemon.placement.lookahead import Lookahead, describe
from computegroups.daemon.placement.records import DoesNotFitNow, Score
from computegroups.daemon.placement.rules import Rules, holders
from computegroups.daemon.placement.search import Problem, best_ties
from computegroups.daemon.placement.topo import Topo


@dataclass(frozen=True)
class Region:
    gpus: tuple[int, ...]
    colocate: frozenset[int] | None
    exclusive: frozenset[int] | None


@dataclass(frozen=True)
class SetChoice:
    gpus: tuple[int, ...]
    region: Region
    key: tuple[object, ...]
    proven: bool
    connected: bool


@dataclass(frozen=True)
class StageCosts:
    """The strategy's part of the objective (after PCIe closeness), from what is in use now.

    binpack: `fresh[d]` is 1 for a domain no group uses (touching it costs),
    `fit[g]` counts the free GPUs in g's domains (tighter places first).
    spread: nothing is fresh and `fit[g]` counts the used GPUs in g's domains
    (least used places first).
    """

    fresh: dict[int, int]
    fit: dict[int, int]


def stage_costs(topo: Topo, rules: Rules, strategy: Strategy) -> StageCosts:
    used = {g: bool(rules.groups(g)) for g in topo.gpus}
    free = {g: not used[g] and not topo.mig[g] and g not in rules.ledger.unavailable for g in topo.gpus}
    fresh: dict[int, int] = {}
    per_domain: list[int] = []
    for d, dom in enumerate(topo.domain_list):
        n_used = sum(used[g] for g in dom)
        if strategy is Strategy.BINPACK:
            fresh[d] = int(n_used == 0)
            per_domain.append(sum(free[g] for g in dom))
        else:
            fresh[d] = 0
            per_domain.append(n_used)
    fit = {g: sum(per_domain[d] for d in topo.domains_of[g]) for g in topo.gpus}
    return StageCosts(fresh, fit)


def regions(topo: Topo, rules: Rules, claim: Claim, free: list[int]) -> list[Region]:
    found = [Region(tuple(free), None, None)]
    if claim.exclusive is not None:
        found = [Region(tuple(g for g in free if g in dom), None, dom)
                 for dom in topo.domains[claim.exclusive] if rules.domain_is_free(dom)]
    if claim.colocate is not None:
        found = [Region(tuple(g for g in r.gpus if g in dom), dom, r.exclusive)
                 for r in found for dom in topo.domains[claim.colocate]]
    n = claim.gpus or 1
    return [r for r in found if len(r.gpus) >= n]


def spare_gpus(topo: Topo, rules: Rules) -> frozenset[int]:
    """The GPUs a plain whole claim could take now: what the look-ahead keeps good sets of."""
    led = rules.ledger
    return frozenset(g for g in topo.gpus if not topo.mig[g] and g not in led.unavailable
                     and not rules.groups(g) and not rules.exclusive_owners(g) and not led.foreign.get(g))


def best_set(topo: Topo, rules: Rules, costs: StageCosts, look: Lookahead, found: list[Region],
             n: int) -> SetChoice | None:
    spare = spare_gpus(topo, rules)
    best: SetChoice | None = None
    for region in found:
        choice = _solve(topo, rules, costs, look, spare, region, n)
        if choice is not None and (best is None or choice.key > best.key):
            best = choice
    return best


def _components(gpus: tuple[int, ...], adj: dict[int, frozenset[int]]) -> list[tuple[int, ...]]:
    """The parts of `gpus` connected over NVLink among themselves."""
    left, out = set(gpus), []
    while left:
        start = min(left)
        seen, todo = {start}, [start]
        while todo:
            for j in adj[todo.pop()] & left:
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
        left -= seen
        out.append(tuple(sorted(seen)))
    return out


def _solve(topo: Topo, rules: Rules, costs: StageCosts, look: Lookahead, spare: frozenset[int],
           region: Region, n: int) -> SetChoice | None:
    """The best set in one region: search the additive keys, then rank the ties by the others.

    Connected first: when some part of the region's free GPUs connected over
    NVLink holds n, only connected sets inside such parts are searched.
    """
    parts = [region.gpus]
    connected = True
    if n > 1:
        big = [c for c in _components(region.gpus, topo.adj) if len(c) >= n]
        connected = bool(big)
        parts = big or parts
    exclusive = region.exclusive is not None
    pairs = n * (n - 1) // 2

    def bound(part: tuple[int, ...]) -> int:
        links = sorted((topo.nv[a][b] for a, b in combinations(part, 2)), reverse=True)
        return sum(links[:pairs]) - topo.r_model

    value: int | None = None
    ties: list[tuple[int, ...]] = []
    proven = True
    for part in sorted(parts, key=bound, reverse=True) if len(parts) > 1 else parts:
        if value is not None and len(parts) > 1 and bound(part) < value:
            break
        local = {g: i for i, g in enumerate(part)}
        penalty = [0 if exclusive else rules.penalty(g) for g in part]
        problem = Problem(
            weight=[[topo.nv[a][b] if a != b else 0 for b in part] for a in part],
            unary=[-p * topo.r_penalty for p in penalty],
            domains=[topo.key_domains(g) for g in part], domain_cost=topo.domain_cost,
            twin=[(topo.twin[g], p, costs.fit[g], g in spare) for g, p in zip(part, penalty, strict=True)],
            adjacency=[frozenset(local[b] for b in topo.adj[g] if b in local) for g in part]
            if connected and n > 1 else None)
        answer = best_ties(problem, n)
        if answer is None:
            continue
        proven = proven and answer.proven
        if value is None or answer.value > value:
            value, ties = answer.value, []
        if answer.value == value:
            ties += [tuple(part[i] for i in s) for s in answer.sets]
    if not ties:
        return None
    keyed = [(set_key(topo, rules, costs, look, spare, region, s, connected), s) for s in ties]
    key, gpus = max(keyed)
    return SetChoice(gpus, region, key, proven, connected)


def set_key(topo: Topo, rules: Rules, costs: StageCosts, look: Lookahead, spare: frozenset[int],
            region: Region, gpus: tuple[int, ...], connected: bool) -> tuple[object, ...]:
    """The whole objective of docs/placement.md, in order; the larger tuple wins."""
    area = region.exclusive if region.exclusive is not None else gpus
    penalty = sum(rules.penalty(g) for g in area)
    links = [topo.nv[a][b] for a, b in combinations(gpus, 2)]
    touched = {d for g in area for d in topo.domains_of[g]}
    return (
        -penalty, connected,
        -len({topo.model[g] for g in gpus}), -len({topo.numa[g] for g in gpus} - {None}),
        sum(links), min(links, default=0),
        look.left(spare, gpus),
        sum(topo.close[a][b] for a, b in combinations(gpus, 2)),
        -sum(costs.fresh[d] for d in touched), -sum(costs.fit[g] for g in area),
        tuple(-g for g in gpus),
    )


def set_score(topo: Topo, look: Lookahead, choice: SetChoice, best_nvlinks: int, spare: frozenset[int],
              n_asked: int) -> Score:
    gpus, region = choice.gpus, choice.region
    pairs = list(combinations(gpus, 2))
    links = [topo.nv[a][b] for a, b in pairs]
    nvlinks = sum(links)
    pcie = sum(topo.close[a][b] for a, b in pairs)
    models = len({topo.model[g] for g in gpus})
    nodes = sorted({node for g in gpus if (node := topo.numa[g]) is not None})
    where = "one model" if models == 1 else f"{models} models"
    if nodes:
        where += f" on NUMA node{'s' if len(nodes) > 1 else ''} {','.join(map(str, nodes))}"
    if len(gpus) == 1:
        text = f"GPU {gpus[0]} whole, {where}"
    else:
        joined = ("connected over NVLink" if choice.connected
                  else f"not connected over NVLink (no connected {n_asked} are free)")
        text = (f"{gpus_phrase(gpus)}: {joined}, {where}; {len(pairs)} pair{'s' if len(pairs) > 1 else ''}, "
                f"{nvlinks} NVLinks in total (best possible {best_nvlinks}), weakest pair {min(links)}")
    text += f"; {describe(topo, look, spare, gpus)}"
    if len(gpus) > 1:
        text += f"; PCIe closeness {pcie}"
    inside = region.exclusive if region.exclusive is not None else region.colocate
    if inside is not None and len(inside) < topo.n:
        text += f"; inside {gpus_phrase(inside)}" + (" held exclusively" if region.exclusive else "")
    if not choice.proven:
        text += " (best found within the search budget)"
    return Score(nvlinks=nvlinks, pcie=pcie, explanation=text, pairs=len(pairs),
                 best_nvlinks=best_nvlinks, proven=choice.proven)


def failure(topo: Topo, rules: Rules, claim: Claim, free: list[int], reasons: dict[int, str]) -> DoesNotFitNow:
    """Why no region holds n free GPUs, from the coarsest cause to the finest."""
    n = claim.gpus or 1
    if len(free) < n:
        text = f"needs {n} whole GPU{'s' if n > 1 else ''}; {len(free)} free"
        text += f": {gpus_phrase(free)}" if free else ""
        return DoesNotFitNow(text, reasons, holders=holders(rules, reasons))
    return DoesNotFitNow(_layout_failure(topo, rules, claim, free))


def _layout_failure(topo: Topo, rules: Rules, claim: Claim, free: list[int]) -> str:
    """Enough GPUs are free, but not as the claim's exclusive or colocate rule wants them."""
    n = claim.gpus or 1
    pool = set(free)
    candidates = [frozenset(pool)]
    if claim.exclusive is not None:
        name = domain_name(claim.exclusive)
        unused = [dom for dom in topo.domains[claim.exclusive] if rules.domain_is_free(dom)]
        if not unused:
            return f"needs {plural(n, 'GPU')} in one {name} no other group uses; every {name} has a group in it"
        candidates = [dom & pool for dom in unused]
        if claim.colocate is None:
            best = max(candidates, key=lambda c: (len(c), -min(c, default=0)))
            return (f"needs {plural(n, 'GPU')} in one {name} no other group uses; the largest unused {name} "
                    f"has {len(best)} free: {gpus_phrase(best)}")
    kind = claim.colocate
    assert kind is not None
    inside = [c & dom for c in candidates for dom in topo.domains[kind]]
    best = max(inside, key=lambda c: (len(c), -min(c, default=0)))
    return (f"needs {plural(n, colocated(kind) + ' GPU')}; the largest free {domain_name(kind)} "
            f"has {len(best)}{': ' + gpus_phrase(best) if best else ''}")
