"""The best k-subset of GPUs under an additive objective: branch and bound.

Choosing k GPUs that maximise the sum of pair weights is the densest
k-subgraph problem, NP-hard in general, but GPU machines are small and very
regular. Three things keep the search short:

- twins: GPUs that weigh the same to every other GPU and cost the same are
  interchangeable, and the lower index always wins the tie-break, so only a
  prefix of each twin class is ever tried (an NVSwitch box collapses to a few
  classes);
- an incumbent from a greedy pass polished by swaps, so most branches are cut
  at once;
- an upper bound per branch: what is chosen, plus for the r GPUs still to
  choose the best r of (own cost + links to the chosen + half the r-1 best
  links it has at all).

The value is additive: pair weights, plus a value per position, minus a cost
per domain the set touches. The search returns every set of the best value
(one per twin class arrangement, the lowest positions of each class), so the
keys that are not additive (the weakest pair, what a set leaves for later)
can rank the ties afterwards. With `adjacency` only sets connected through it
count. Up to `EXACT_LIMIT` candidates the search always runs to the end;
above it a budget of branches bounds the time and the answer is the best
found (reported as not proven). The budget counts branches, each worth about
`m` steps, so the time it allows does not depend on the clock.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

EXACT_LIMIT = 16
WORK_BUDGET = 30_000


@dataclass(frozen=True)
class Problem:
    """A subset problem over local positions 0..m-1.

    `weight[i][j]` >= 0 is the value of having both i and j; `unary[i]` the
    value (usually a negative cost) of i; `domains[i]` the domains i lies in,
    each costing `domain_cost[d]` once if the set touches it at all; `twin[i]`
    equal for interchangeable positions (lower position = preferred twin;
    twins must also have the same neighbours in `adjacency`).
    """

    weight: Sequence[Sequence[int]]
    unary: Sequence[int]
    domains: Sequence[tuple[int, ...]]
    domain_cost: Mapping[int, int]
    twin: Sequence[Hashable]
    adjacency: Sequence[frozenset[int]] | None = None
    """Neighbours of each position: when given, only connected sets count."""

    @property
    def size(self) -> int:
        return len(self.unary)

    def value(self, chosen: Sequence[int]) -> int:
        """The objective of a set, computed from scratch (for the greedy start)."""
        total = sum(self.unary[i] for i in chosen)
        for a, i in enumerate(chosen):
            row = self.weight[i]
            total += sum(row[j] for j in chosen[a + 1:])
        touched = {d for i in chosen for d in self.domains[i]}
        return total - sum(self.domain_cost.get(d, 0) for d in touched)

    def connected(self, chosen: Sequence[int]) -> bool:
        return self.adjacency is None or is_connected(chosen, self.adjacency)


@dataclass(frozen=True)
class Answer:
    value: int
    chosen: tuple[int, ...]
    proven: bool


@dataclass(frozen=True)
class Ties:
    """Every set of the best value, each sorted, in the order found; `proven` as in `Answer`."""

    value: int
    sets: tuple[tuple[int, ...], ...]
    proven: bool


_NONE = -(1 << 400)


def is_connected(chosen: Sequence[int], adjacency: Sequence[frozenset[int]]) -> bool:
    members = set(chosen)
    if len(members) <= 1:
        return True
    start = next(iter(members))
    seen, todo = {start}, [start]
    while todo:
        for j in adjacency[todo.pop()] & members:
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return len(seen) == len(members)


def best_subset(problem: Problem, k: int, budget: int | None = None) -> Answer | None:
    """The k positions of highest value (the first of the ties), or None when no set qualifies."""
    found = best_ties(problem, k, budget)
    if found is None:
        return None
    return Answer(found.value, found.sets[0], found.proven)


def best_ties(problem: Problem, k: int, budget: int | None = None) -> Ties | None:
    """Every set of k positions of the highest value, or None when fewer than k exist (or none is connected)."""
    m = problem.size
    if k > m or k < 1:
        return None
    if budget is None and m > EXACT_LIMIT:
        budget = WORK_BUDGET // m
    return _Search(problem, k, budget).run()


class _Search:
    """Depth-first over positions sorted most promising first.

    The problem is renumbered into that order at the start, so a branch at
    position `start` only ever looks at the tail `start:` of each array.
    """

    def __init__(self, problem: Problem, k: int, budget: int | None) -> None:
        self.original = problem
        self.k = k
        self.budget = budget
        self.nodes = 0
        m = problem.size
        top = [[0, *accumulate(sorted(problem.weight[i], reverse=True))] for i in range(m)]
        self.order = _order(problem, k, top)
        o = self.order
        self.weight = [[problem.weight[i][j] for j in o] for i in o]
        self.unary = [problem.unary[i] for i in o]
        self.domains = [problem.domains[i] for i in o]
        self.cost = problem.domain_cost
        self.twin = [problem.twin[i] for i in o]
        self.top = [[top[i][r - 1] for i in o] for r in range(1, k + 1)]
        self.cross = [0] * m
        self.chosen: list[int] = []
        self.touched: dict[int, int] = {}
        self.best_value = _NONE
        self.best: list[tuple[int, ...]] = []
        self.exhausted = True

    def run(self) -> Ties | None:
        first = _greedy(self.original, self.k, self.order)
        if first is not None:
            self.best_value = self.original.value(first)
        self._branch(0, 0)
        if not self.best:
            if first is None:
                return None
            self.best = [tuple(sorted(first))]
        return Ties(self.best_value, tuple(self.best), self.exhausted)

    def _record(self, value: int, chosen: list[int]) -> None:
        picked = tuple(sorted(self.order[p] for p in chosen))
        if not self.original.connected(picked):
            return
        if value > self.best_value:
            self.best_value = value
            self.best = []
        self.best.append(picked)

    def _bound(self, start: int, r: int, value: int) -> int:
        """Twice the best value any completion of this branch could reach."""
        rest = zip(self.unary[start:], self.cross[start:], self.top[r - 1][start:], strict=True)
        gains = [2 * (u + c) + t for u, c, t in rest]
        gains.sort(reverse=True)
        return 2 * value + sum(gains[:r])

    def _branch(self, start: int, value: int) -> None:
        chosen = self.chosen
        r = self.k - len(chosen)
        m = len(self.unary)
        if m - start < r:
            return
        self.nodes += 1
        if self.budget is not None and self.nodes > self.budget:
            self.exhausted = False
            return
        if r == 1:
            self._finish(start, value)
            return
        if self._bound(start, r, value) < 2 * self.best_value:
            return
        twin = self.twin
        for pos in range(start, m - r + 1):
            if pos > start and twin[pos] == twin[pos - 1]:
                continue
            gain = self._take(pos)
            chosen.append(pos)
            self._branch(pos + 1, value + gain)
            chosen.pop()
            self._drop(pos)
            if self.budget is not None and self.nodes > self.budget:
                return

    def _finish(self, start: int, value: int) -> None:
        """The last GPU of a branch: no need to branch, the best ones are known."""
        upper = [u + c for u, c in zip(self.unary[start:], self.cross[start:], strict=True)]
        if not upper or value + max(upper) < self.best_value:
            return
        twin = self.twin
        for offset in sorted(range(len(upper)), key=upper.__getitem__, reverse=True):
            if value + upper[offset] < self.best_value:
                break
            pos = start + offset
            if pos > start and twin[pos] == twin[pos - 1]:
                continue
            gain = self._gain(pos)
            if value + gain >= self.best_value:
                self.chosen.append(pos)
                self._record(value + gain, self.chosen)
                self.chosen.pop()

    def _gain(self, pos: int) -> int:
        gain = self.unary[pos] + self.cross[pos]
        for d in self.domains[pos]:
            if not self.touched.get(d, 0):
                gain -= self.cost.get(d, 0)
        return gain

    def _take(self, pos: int) -> int:
        gain = self._gain(pos)
        for d in self.domains[pos]:
            self.touched[d] = self.touched.get(d, 0) + 1
        row, cross = self.weight[pos], self.cross
        cross[pos + 1:] = [c + w for c, w in zip(cross[pos + 1:], row[pos + 1:], strict=True)]
        return gain

    def _drop(self, pos: int) -> None:
        for d in self.domains[pos]:
            self.touched[d] -= 1
        row, cross = self.weight[pos], self.cross
        cross[pos + 1:] = [c - w for c, w in zip(cross[pos + 1:], row[pos + 1:], strict=True)]


def _order(p: Problem, k: int, top: list[list[int]]) -> list[int]:
    """Most promising first, twins contiguous and in position order."""
    first: dict[Hashable, int] = {}
    for i in range(p.size):
        first.setdefault(p.twin[i], i)
    potential = {t: 2 * p.unary[i] + top[i][k - 1] for t, i in first.items()}
    return sorted(range(p.size), key=lambda i: (-potential[p.twin[i]], first[p.twin[i]], i))


def _greedy(p: Problem, k: int, order: list[int]) -> list[int] | None:
    """A good first answer: grow from the most promising GPU, then swap while it helps.

    With adjacency it grows through neighbours only and makes no swaps; it
    gives up (None) when it gets stuck, and the search starts without one.
    """
    state = _Incremental(p)
    state.add(order[0])
    while len(state.chosen) < k:
        options = [j for j in order if j not in state.members]
        if p.adjacency is not None:
            near = frozenset().union(*(p.adjacency[i] for i in state.chosen))
            options = [j for j in options if j in near]
            if not options:
                return None
        state.add(max(options, key=lambda j: (state.gain(j), -j)))
    if p.adjacency is None:
        while state.improve():
            pass
    return state.chosen


class _Incremental:
    """A set with its links to every position kept up to date, for O(1) gains."""

    def __init__(self, p: Problem) -> None:
        self.p = p
        self.chosen: list[int] = []
        self.members: set[int] = set()
        self.cross = [0] * p.size
        self.touched: dict[int, int] = {}

    def gain(self, j: int) -> int:
        """What adding j to the set is worth."""
        p = self.p
        value = p.unary[j] + self.cross[j]
        for d in p.domains[j]:
            if not self.touched.get(d, 0):
                value -= p.domain_cost.get(d, 0)
        return value

    def add(self, j: int) -> None:
        self._move(j, 1)
        self.chosen.append(j)
        self.members.add(j)

    def remove(self, j: int) -> None:
        self._move(j, -1)
        self.chosen.remove(j)
        self.members.discard(j)

    def _move(self, j: int, sign: int) -> None:
        row, cross = self.p.weight[j], self.cross
        for x in range(len(cross)):
            cross[x] += sign * row[x]
        for d in self.p.domains[j]:
            self.touched[d] = self.touched.get(d, 0) + sign

    def improve(self) -> bool:
        """Make the single best swap that raises the value; False when none does."""
        best: tuple[int, int, int] | None = None
        for a in list(self.chosen):
            self.remove(a)
            loss = self.gain(a)
            for j in range(self.p.size):
                if j not in self.members and j != a:
                    delta = self.gain(j) - loss
                    if delta > 0 and (best is None or delta > best[0]):
                        best = (delta, a, j)
            self.add(a)
        if best is None:
            return False
        self.remove(best[1])
        self.add(best[2])
        return True
