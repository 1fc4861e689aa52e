"""Invariants over random machines and random sequences of claims and releases.

Each example builds a machine, replays a list of operations and checks after
each one, from the public API only, that nothing the allocator promises was
broken. The example counts are modest and derandomized so CI stays quick and
repeatable.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from computegroups.daemon.model.claims import AffinityTerm, Claim, Strategy
from computegroups.daemon.placement.allocator import Allocator, Placement, PlacementError
from computegroups.topology import load_machine, simulated_machine_names
from computegroups.topology.model import DomainKind, Machine
from tests.daemon.placement.allocator_machines import a100_mig, change, follow, random_machine
from tests.daemon.placement.test_allocator_optimal import connected

COMPONENTS = ("web", "db", "etl")
KINDS = [DomainKind.NVLINK, DomainKind.PCIE, DomainKind.NUMA]
PROFILE = settings(max_examples=80, derandomize=True, deadline=None)

terms = st.lists(st.builds(AffinityTerm, st.sampled_from(COMPONENTS),
                           st.sampled_from(["device", "nvlink", "pcie", "numa"])), max_size=1).map(tuple)
rules = {"strategy": st.sampled_from(list(Strategy)), "priority": st.integers(0, 2),
         "anti_affinity": terms, "affinity": st.just(()) | terms}
sometimes = st.sampled_from([None, None, None]) | st.sampled_from(KINDS)
claims = st.one_of(
    st.builds(Claim, gpus=st.integers(1, 3), colocate=sometimes | st.just(DomainKind.MACHINE),
              exclusive=sometimes, allow_busy=st.booleans(), **rules),
    st.builds(Claim, memory_mib=st.integers(1, 12_000), compute_pct=st.none() | st.integers(1, 60),
              distinct=st.booleans(), exclusive=sometimes, **rules),
    st.builds(Claim, compute_pct=st.integers(1, 60), distinct=st.booleans(), **rules),
    st.builds(Claim, mig=st.sampled_from(["1g.5gb", "3g.20gb"]), distinct=st.booleans(), **rules),
)
allocate = st.tuples(st.just("allocate"), claims, st.integers(1, 3), st.booleans())
operations = st.one_of(
    allocate, allocate, allocate,
    st.tuples(st.just("release"), st.integers(0, 50)),
    st.tuples(st.just("users"), st.integers(0, 50), st.sets(st.sampled_from(COMPONENTS), max_size=2)),
    st.tuples(st.just("take"), st.integers(0, 50)),
    st.tuples(st.just("drain"), st.sets(st.integers(0, 15), max_size=2)),
    st.tuples(st.just("foreign"), st.dictionaries(st.integers(0, 15), st.integers(0, 30_000), max_size=2)),
)
machines = st.one_of(
    st.integers(0, 10**6).map(lambda seed: random_machine(random.Random(seed))),
    st.sampled_from([n for n in simulated_machine_names() if n != "synthetic-72"]).map(load_machine),
    st.just(a100_mig()),
)


@dataclass
class Run:
    """One replay: the allocator, what it answered, and the names it gave out."""

    machine: Machine
    allocator: Allocator
    answers: list
    next_id: int = 0

    @classmethod
    def start(cls, machine: Machine) -> Run:
        return cls(machine, Allocator(machine), [])

    def live(self, index: int) -> str | None:
        ids = [h.group_id for h in self.allocator.holdings()]
        return ids[index % len(ids)] if ids else None

    def apply(self, op: tuple) -> None:
        a = self.allocator
        if op[0] == "allocate":
            self._allocate(op[1], op[2], op[3])
        elif op[0] == "release" and (gid := self.live(op[1])):
            a.release(gid)
        elif op[0] == "users" and (gid := self.live(op[1])):
            change(a, gid, users=frozenset(op[2]))
        elif op[0] == "take" and (gid := self.live(op[1])):
            change(a, gid, reserved=False)
        elif op[0] == "drain":
            a.set_unavailable(g for g in op[1] if g < len(self.machine.gpus))
        elif op[0] == "foreign":
            a.set_foreign({g: v for g, v in op[1].items() if g < len(self.machine.gpus)})

    def _allocate(self, claim: Claim, count: int, reserved: bool) -> None:
        a = self.allocator
        ids = [f"g{self.next_id + i}" for i in range(count)]
        self.next_id += count
        before = (a.holdings(), a.free_summary())
        try:
            placements = a.allocate(claim, ids, "owner", reserved=reserved)
        except PlacementError as exc:
            assert (a.holdings(), a.free_summary()) == before, "a failed placement changed the state"
            self.answers.append((type(exc).__name__, str(exc)))
            return
        self.answers.append(placements)
        check_placements(self.machine, claim, placements, before)


def check_placements(m: Machine, claim: Claim, placements: tuple[Placement, ...], before) -> None:
    holdings, use = before
    use_by_gpu = {u.gpu: u for u in use}
    displaced = {gid for p in placements for gid in p.displaced}
    by_id = {h.group_id: h for h in holdings}
    for gid in displaced:
        assert by_id[gid].reserved and by_id[gid].priority < claim.priority, "displaced running work"
    others = [h for h in holdings if h.group_id not in displaced]
    if claim.distinct:
        gpus = [p.devices[0].gpu for p in placements]
        assert len(set(gpus)) == len(gpus), "distinct replicas share a GPU"
    if not displaced:
        check_mig_fallback(m, claim, placements[0], holdings, use_by_gpu)
    for p in placements:
        for d in p.devices:
            assert use_by_gpu[d.gpu].available, "placed on a draining GPU"
            if d.whole and d.mig_uuid is None and not claim.allow_busy:
                assert not use_by_gpu[d.gpu].memory_foreign_mib, "whole GPU with foreign processes"
        if claim.colocate is not None:
            assert any(set(p.gpus) <= dom for dom in m.domains(claim.colocate)), "not colocated"
        for term in claim.anti_affinity:
            assert not set(p.gpus) & near(m, others, term), "anti-affinity broken"
        for term in claim.affinity:
            assert set(p.gpus) <= near(m, others, term), "affinity broken"


def check_mig_fallback(m: Machine, claim: Claim, first: Placement, holdings, use_by_gpu) -> None:
    """Issue 15: a plain memory share takes a MIG instance only when no GPU share fits, and then
    the smallest free one that fits (claims with placement rules of their own left out)."""
    d = first.devices[0]
    if (d.mig_uuid is None or claim.mig is not None or claim.affinity or claim.anti_affinity
            or claim.exclusive is not None):
        return
    held_whole = {x.gpu for h in holdings for x in h.devices if x.whole and x.mig_uuid is None}
    for g, u in use_by_gpu.items():
        if not u.mig and u.available and g not in held_whole and u.exclusive_group is None:
            assert u.memory_free_mib < (claim.memory_mib or 0), f"a MIG instance while GPU {g} had room"
    taken = {x.mig_uuid for h in holdings for x in h.devices}
    free = [i.memory_mib or 0 for g in m.gpus if use_by_gpu[g.index].available
            and use_by_gpu[g.index].exclusive_group is None
            for i in g.mig_devices if i.uuid not in taken and (i.memory_mib or 0) >= (claim.memory_mib or 0)]
    assert d.memory_mib == min(free), "not the smallest free MIG instance that fits"


def near(m: Machine, holdings, term: AffinityTerm) -> set[int]:
    gpus = {d.gpu for h in holdings if term.component in h.users for d in h.devices}
    if term.level == "device":
        return gpus
    return {x for g in gpus for dom in m.domains(DomainKind(term.level)) if g in dom for x in dom}


def check_state(m: Machine, a: Allocator) -> None:
    holdings = a.holdings()
    memory: dict[int, int] = {}
    compute: dict[int, int] = {}
    devices: dict[int, list] = {}
    migs: list[str] = []
    for h in holdings:
        for d in h.devices:
            gpu = m.gpu(d.gpu)
            devices.setdefault(d.gpu, []).append(d)
            if d.mig_uuid is not None:
                assert gpu.mig_enabled, "MIG device on a GPU without MIG"
                migs.append(d.mig_uuid)
                continue
            assert not gpu.mig_enabled, "plain device on a MIG GPU"
            memory[d.gpu] = memory.get(d.gpu, 0) + d.memory_mib
            compute[d.gpu] = compute.get(d.gpu, 0) + d.compute_pct
    assert len(migs) == len(set(migs)), "a MIG instance given twice"
    sizes: dict[int, int] = {}
    for h in holdings:
        for d in h.devices:
            if d.mig_uuid is None and not d.whole:
                sizes[d.memory_mib] = sizes.get(d.memory_mib, 0) + 1
    assert a.ledger.share_sizes == sizes, "the ledger's live share sizes differ from the holdings"
    for g, ds in devices.items():
        assert memory.get(g, 0) <= (m.gpu(g).memory_mib or 0), f"memory of GPU {g} exceeded"
        assert compute.get(g, 0) <= 100, f"compute of GPU {g} exceeded"
        if any(d.whole and d.mig_uuid is None for d in ds):
            assert len(ds) == 1, f"whole GPU {g} shared"
    for h in holdings:
        if h.exclusive_domain:
            for other in holdings:
                if other.group_id != h.group_id:
                    assert not {d.gpu for d in other.devices} & h.exclusive_domain, "exclusive domain entered"
                    assert not (other.exclusive_domain or set()) & h.exclusive_domain, "exclusive overlap"
            assert {d.gpu for d in h.devices} <= h.exclusive_domain


def replay(m: Machine, ops: list) -> Run:
    run = Run.start(m)
    for op in ops:
        run.apply(op)
        check_state(m, run.allocator)
    return run


@settings(PROFILE, max_examples=200)
@given(machines, st.lists(operations, min_size=5, max_size=30))
def test_invariants_hold_after_every_operation(m: Machine, ops: list) -> None:
    replay(m, ops)


@PROFILE
@given(machines, st.lists(operations, min_size=5, max_size=25))
def test_releasing_everything_empties_the_machine(m: Machine, ops: list) -> None:
    a = replay(m, ops).allocator
    for h in a.holdings():
        a.release(h.group_id)
    fresh = Allocator(m)
    fresh.set_unavailable(g.gpu for g in a.free_summary() if not g.available)
    fresh.set_foreign({g.gpu: g.memory_foreign_mib for g in a.free_summary()})
    assert a.free_summary() == fresh.free_summary()


@PROFILE
@given(machines, st.lists(operations, min_size=5, max_size=25))
def test_same_inputs_give_the_same_answers(m: Machine, ops: list) -> None:
    assert replay(m, ops).answers == replay(m, ops).answers


@PROFILE
@given(machines, st.lists(operations, min_size=5, max_size=25), claims)
def test_following_the_same_holdings_gives_the_same_allocator(m: Machine, ops: list, claim: Claim) -> None:
    a = replay(m, ops).allocator
    b = Allocator(m)
    b.set_unavailable(g.gpu for g in a.free_summary() if not g.available)
    b.set_foreign({g.gpu: g.memory_foreign_mib for g in a.free_summary()})
    follow(b, a.holdings())
    assert b.holdings() == a.holdings() and b.free_summary() == a.free_summary()
    answers: list[object] = []
    for allocator in (a, b):
        try:
            answers.append(allocator.allocate(claim, ["after"], "owner"))
        except PlacementError as exc:
            answers.append(str(exc))
    assert answers[0] == answers[1]


def _best_now(m: Machine, a: Allocator, claim: Claim) -> tuple | None:
    """Keys 1-3 of the best set of plain free GPUs (brute force): connected, models, NUMA, NVLinks, weakest."""
    free = [u.gpu for u in a.free_summary() if u.whole_free and not u.memory_foreign_mib]
    best = None
    for s in combinations(free, claim.gpus or 1):
        best = max(best or _keys(m, s), _keys(m, s))
    return best


def _keys(m: Machine, s) -> tuple:
    links = [m.nvlinks(x, y) for i, x in enumerate(s) for y in s[i + 1:]]
    return (connected(m, s), -len({m.gpu(g).name for g in s}), -len({m.gpu(g).numa_node for g in s} - {None}),
            sum(links), min(links, default=0))


small_machines = st.one_of(
    st.integers(0, 10**6).map(lambda seed: random_machine(random.Random(seed), random.Random(seed).randint(2, 10))),
    st.sampled_from(["dgx1-v100", "dgx-h100", "workstation-nvlink-pairs", "two-islands-16"]).map(load_machine),
)
wholes = st.lists(st.tuples(st.integers(1, 4), st.booleans()), min_size=1, max_size=8)


@PROFILE
@given(small_machines, wholes)
def test_connected_first_and_look_ahead_never_worse_now(m: Machine, steps: list) -> None:
    """Each plain `gpus: N` gets a set as good on keys 1-3 as the best set now: look-ahead only breaks ties.

    Connected first is key 1: no disconnected set while a connected one of that size is free.
    """
    a = Allocator(m)
    for i, (n, release) in enumerate(steps):
        claim = Claim(gpus=n)
        best = _best_now(m, a, claim)
        try:
            got = a.allocate(claim, [f"w{i}"], "owner")[0]
        except PlacementError:
            assert best is None
            continue
        assert _keys(m, got.gpus) == best
        if release and i % 2:
            a.release(f"w{i}")


@PROFILE
@given(small_machines, wholes)
def test_the_same_whole_claims_give_the_same_sets(m: Machine, steps: list) -> None:
    def run() -> list:
        a = Allocator(m)
        out: list[object] = []
        for i, (n, _) in enumerate(steps):
            try:
                out.append(a.allocate(Claim(gpus=n), [f"w{i}"], "o")[0])
            except PlacementError as exc:
                out.append(str(exc))
        return out

    assert run() == run()
