"""What a set leaves for later: the best partition of the free GPUs into connected sets.

Among sets that tie on the keys before it, the allocator takes the one that
leaves the best sets for the claims that come next. "Best" is judged over
the sizes that matter (`Topo.lookahead_sizes`: 2, 4, 8 and the largest
NVLink island): the free GPUs are split into NVLink-connected blocks of those
sizes, the largest blocks first, and each block is rated by (size, NVLink
sum, weakest pair). Of all such partitions the one whose ratings, sorted
from the best down, come first is the value of what is left. A pair-only view
can not see that taking 2,3 first on dgx1-v100 leaves only a 1-link pair
next to the other quad while 0,3 leaves a 2-link one; this does.

A connected block never leaves its NVLink island, so the partition is worked
out per island, and two candidate sets are compared on the islands they
touch. Per island the partition depends on its free GPUs alone, and GPUs
with the same NVLinks to every other GPU are interchangeable, so its ratings
are kept by how many GPUs of each such twin class are free (a pure cache:
what it returns does not depend on what was asked before; an NVSwitch island
of any size is one class), and a block is tried once per arrangement of
twins.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable
from itertools import combinations

from computegroups.daemon.placement.explain import gpu_list
from computegroups.daemon.placement.search import Problem, best_ties
from computegroups.daemon.placement.topo import Topo

CACHE_LIMIT = 200_000
"""Partitions kept; past it the cache starts again (results are the same either way)."""

Rating = tuple[int, int, int]
"""A block: (size, NVLink sum, weakest pair)."""


def rate(topo: Topo, gpus: Iterable[int]) -> Rating:
    members = sorted(gpus)
    links = [topo.nv[a][b] for a, b in combinations(members, 2)]
    return (len(members), sum(links), min(links, default=0))


class Lookahead:
    def __init__(self, topo: Topo) -> None:
        self.topo = topo
        self._cache: dict[tuple[tuple[Hashable, int], ...], tuple[Rating, ...]] = {}

    def left(self, free: frozenset[int], taken: Iterable[int]) -> tuple[Rating, ...]:
        """The ratings of the best partition of `free` less `taken`, best first (comparable as tuples)."""
        gone = set(taken)
        out: list[Rating] = []
        for island in self.topo.islands:
            part = free & island
            if len(part) > 1:
                out += self.ratings(part - gone if gone & island else part)
        out.sort(reverse=True)
        return tuple(out)

    def ratings(self, free: frozenset[int]) -> tuple[Rating, ...]:
        """The ratings of the best partition of some free GPUs of one island, best first.

        Kept by how many GPUs of each NVLink twin class are free: swapping
        twins maps one partition onto another of the same ratings.
        """
        key = tuple(sorted(Counter(self.topo.nv_twin[g] for g in free).items()))
        found = self._cache.get(key)
        if found is None:
            found = self._first(free)[0]
            if len(self._cache) >= CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = found
        return found

    def blocks(self, free: frozenset[int]) -> list[tuple[int, ...]]:
        """The blocks of the best partition of some free GPUs of one island (the lowest indices of ties)."""
        out: list[tuple[int, ...]] = []
        while True:
            _, block = self._first(free)
            if block is None:
                return out
            out.append(block)
            free = free - set(block)

    def _first(self, free: frozenset[int]) -> tuple[tuple[Rating, ...], tuple[int, ...] | None]:
        """The ratings of the best partition and its first block: the best blocks of the largest size, tried."""
        for k in self.topo.lookahead_sizes:
            if k > len(free):
                continue
            best: tuple[tuple[Rating, ...], tuple[int, ...] | None] = ((), None)
            for block in self._best_blocks(free, k):
                rest = self.ratings(free - set(block)) if len(free) - k > 1 else ()
                option = (rate(self.topo, block), *rest)
                if best[1] is None or option > best[0]:
                    best = (option, block)
            if best[1] is not None:
                return best
        return (), None

    def _best_blocks(self, free: frozenset[int], k: int) -> list[tuple[int, ...]]:
        """The connected k-sets of `free` with the most NVLinks, then the strongest weakest pair."""
        topo = self.topo
        gpus = sorted(free)
        local = {g: i for i, g in enumerate(gpus)}
        problem = Problem(
            weight=[[topo.nv[a][b] if a != b else 0 for b in gpus] for a in gpus],
            unary=[0] * len(gpus), domains=[()] * len(gpus), domain_cost={},
            twin=[topo.nv_twin[g] for g in gpus],
            adjacency=[frozenset(local[b] for b in topo.adj[g] if b in free) for g in gpus])
        ties = best_ties(problem, k)
        if ties is None:
            return []
        sets = [tuple(gpus[i] for i in s) for s in ties.sets]
        weakest = max(rate(topo, s)[2] for s in sets)
        return sorted(s for s in sets if rate(topo, s)[2] == weakest)


def describe(topo: Topo, look: Lookahead, free: frozenset[int], taken: Iterable[int]) -> str:
    """`leaves 5,6 as a 2-link pair`: the best blocks left in the islands the set touches."""
    gone = set(taken)
    blocks: list[tuple[int, ...]] = []
    for island in topo.islands:
        if gone & island:
            blocks += look.blocks((free & island) - gone)
    if not blocks:
        return "leaves no NVLink-connected set in its island" + ("s" if len(
            {topo.island_of[g] for g in gone}) > 1 else "")
    groups: dict[Rating, list[tuple[int, ...]]] = {}
    for block in blocks:
        groups.setdefault(rate(topo, block), []).append(block)
    parts = []
    for (size, links, _), members in sorted(groups.items(), reverse=True):
        name = {2: "pair", 4: "quad"}.get(size, f"{size}-GPU set")
        many = len(members) > 1
        shown = " and ".join(gpu_list(b) for b in members[:3]) + (f" and {len(members) - 3} more" if
                                                                   len(members) > 3 else "")
        article = "" if many else "an " if str(links).startswith(("8", "11", "18")) else "a "
        parts.append(f"{shown} as {article}{links}-link {name}{'s' if many else ''}")
    return "leaves " + ", ".join(parts)
