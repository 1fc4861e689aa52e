"""Whole GPUs: the best set of n free GPUs, one search per admissible region.

A region is where the whole set must lie: anywhere, one colocation domain, or
one unused domain to hold exclusively. The objective (see `topo.Topo`) is
the same in every region, so the best region is simply the highest value.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from computegroups.daemon.model.claims import Claim, Strategy
from computegroups.daemon.placement.explain import colocated, domain_name, gpus_phrase
from computegroups.daemon.placement.records import DoesNotFitNow, Score
from computegroups.daemon.placement.rules import Rules, holders
from computegroups.daemon.placement.search import Problem, best_subset
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
    value: int
    proven: bool


@dataclass(frozen=True)
class StageCosts:
    """The "keep the best for later" part of the objective, from what is in use now.

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


def best_set(topo: Topo, rules: Rules, costs: StageCosts, found: list[Region], n: int) -> SetChoice | None:
    best: SetChoice | None = None
    for region in found:
        choice = _solve(topo, rules, costs, region, n)
        if choice is not None and (best is None or choice.value > best.value):
            best = choice
    return best


def _solve(topo: Topo, rules: Rules, costs: StageCosts, region: Region, n: int) -> SetChoice | None:
    gpus = region.gpus
    cols = [topo.pos[g] for g in gpus]
    weight = [[topo.weight_rows[g][c] for c in cols] for g in gpus]
    penalty = [rules.penalty(g) for g in gpus]
    if region.exclusive is None:
        unary = [-p * topo.r_penalty - costs.fit[g] * topo.r_fit + topo.index_bonus(g)
                 for g, p in zip(gpus, penalty, strict=True)]
        problem = Problem(weight, unary, [topo.domains_of[g] for g in gpus],
                          {d: topo.r_fresh for d, f in costs.fresh.items() if f},
                          [(topo.twin[g], p, costs.fit[g]) for g, p in zip(gpus, penalty, strict=True)])
        extra = 0
    else:
        problem = Problem(weight, [topo.index_bonus(g) for g in gpus], [()] * len(gpus), {},
                          [topo.twin[g] for g in gpus])
        extra = _exclusive_cost(topo, rules, costs, region.exclusive)
    answer = best_subset(problem, n)
    if answer is None:
        return None
    return SetChoice(tuple(gpus[i] for i in answer.chosen), region, answer.value + extra, answer.proven)


def _exclusive_cost(topo: Topo, rules: Rules, costs: StageCosts, dom: frozenset[int]) -> int:
    """An exclusive set takes its whole domain: cost the domain, not just the set."""
    touched = {d for g in dom for d in topo.domains_of[g]}
    return -(sum(rules.penalty(g) for g in dom) * topo.r_penalty
             + sum(costs.fresh[d] for d in touched) * topo.r_fresh
             + sum(costs.fit[g] for g in dom) * topo.r_fit)


def set_score(topo: Topo, gpus: tuple[int, ...], best_nvlinks: int, proven: bool, left_whole: list[int],
              region: Region) -> Score:
    pairs = list(combinations(gpus, 2))
    nvlinks = sum(topo.nv[a][b] for a, b in pairs)
    pcie = sum(topo.close[a][b] for a, b in pairs)
    if len(gpus) == 1:
        text = f"GPU {gpus[0]} whole"
    else:
        text = (f"{gpus_phrase(gpus)}: {len(pairs)} pair{'s' if len(pairs) > 1 else ''}, {nvlinks} NVLinks in total "
                f"(best possible {best_nvlinks}), PCIe closeness {pcie}")
    where = region.exclusive if region.exclusive is not None else region.colocate
    if where is not None and len(where) < topo.n:
        text += f"; inside {gpus_phrase(where)}" + (" held exclusively" if region.exclusive else "")
    text += f"; leaves {gpus_phrase(left_whole)} whole" if left_whole else "; no whole GPU left"
    if not proven:
        text += " (best found within the search budget)"
    return Score(nvlinks=nvlinks, pcie=pcie, explanation=text, pairs=len(pairs),
                 best_nvlinks=best_nvlinks, proven=proven)


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
            return f"needs {n} GPUs in one {name} no other group uses; every {name} has a group in it"
        candidates = [dom & pool for dom in unused]
        if claim.colocate is None:
            best = max(candidates, key=lambda c: (len(c), -min(c, default=0)))
            return (f"needs {n} GPUs in one {name} no other group uses; the largest unused {name} "
                    f"has {len(best)} free: {gpus_phrase(best)}")
    kind = claim.colocate
    assert kind is not None
    inside = [c & dom for c in candidates for dom in topo.domains[kind]]
    best = max(inside, key=lambda c: (len(c), -min(c, default=0)))
    return (f"needs {n} {colocated(kind)} GPUs; the largest free {domain_name(kind)} "
            f"has {len(best)}{': ' + gpus_phrase(best) if best else ''}")
