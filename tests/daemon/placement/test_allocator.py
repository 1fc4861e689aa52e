"""Scenarios on every simulated machine: what a user sees from the allocator."""

from __future__ import annotations

import pytest

from computegroups.daemon.model.claims import AffinityTerm, AllocatorConfig, Claim, Level, Strategy
from computegroups.daemon.placement.allocator import (
    Allocator,
    DeviceShare,
    DoesNotFitNow,
    Holding,
    NeverFits,
    PlacementError,
)
from computegroups.topology import load_machine, simulated_machine_names
from computegroups.topology.model import DomainKind
from tests.daemon.placement.allocator_machines import PIX, build, change, follow, islands

GIB = 1024


def machine(name: str):
    return load_machine(name)


def gpus_of(placements) -> list[tuple[int, ...]]:
    return [p.gpus for p in placements]


def one(allocator: Allocator, claim: Claim, gid: str = "g", owner: str = "ada", **kw):
    (placement,) = allocator.allocate(claim, [gid], owner, **kw)
    return placement


# --- the examples of issue 15: connected first, then look ahead --------------------------------

def test_dgx1_quad_then_two_pairs_leaves_two_link_pairs() -> None:
    """A quad, then a pair that leaves the other 2-link pair (4,7 then 5,6), not 6,7 then 4,5 (1 link)."""
    m = machine("dgx1-v100")
    a = Allocator(m)
    quad = one(a, Claim(gpus=4), "quad")
    first = one(a, Claim(gpus=2), "pair")
    second = one(a, Claim(gpus=2), "pair2")
    assert (quad.gpus, first.gpus, second.gpus) == ((0, 1, 2, 3), (4, 7), (5, 6))
    assert m.nvlinks(*first.gpus) == m.nvlinks(*second.gpus) == 2
    assert quad.score.explanation == (
        "GPUs 0-3: connected over NVLink, one model on NUMA node 0; 6 pairs, 9 NVLinks in total "
        "(best possible 9), weakest pair 1; leaves 4-7 as a 9-link quad; PCIe closeness 16")
    assert "leaves 5,6 as a 2-link pair" in first.score.explanation


def test_dgx1_two_pairs_then_a_quad_keeps_a_nine_link_quad() -> None:
    """Pairs taken inside one quad (0,3 then 1,2) keep 4-7 whole for the quad that follows."""
    m = machine("dgx1-v100")
    a = Allocator(m)
    pairs = [one(a, Claim(gpus=2), f"p{i}") for i in range(2)]
    quad = one(a, Claim(gpus=4), "quad")
    assert [p.gpus for p in pairs] == [(0, 3), (1, 2)]
    assert quad.gpus == (4, 5, 6, 7) and quad.score.nvlinks == 9
    assert "leaves 4-7 as a 9-link quad" in pairs[1].score.explanation


def test_dgx1_lone_pair_stays_inside_one_quad_and_spares_the_next_pair() -> None:
    """0,3 and 2,3 both have 2 NVLinks in one quad; 0,3 leaves 1,2 a 2-link pair, 2,3 would leave 0,1 with 1."""
    pair = one(Allocator(machine("dgx1-v100")), Claim(gpus=2))
    assert pair.gpus == (0, 3)
    assert "2 NVLinks in total (best possible 2)" in pair.score.explanation
    assert "leaves 4-7 as a 9-link quad, 1,2 as a 2-link pair" in pair.score.explanation


def test_synthetic_72_quad_stays_connected_and_on_one_model() -> None:
    """Only 8-11 (a V100 cube-mesh quad) and 48-50 (A100s on another NUMA node) free: 8-11, not 8,48,49,50."""
    m = machine("synthetic-72")
    a = Allocator(m)
    keep = {8, 9, 10, 11, 48, 49, 50}
    rest = tuple(g.index for g in m.gpus if g.index not in keep and not g.mig_enabled)
    one(a, Claim(gpus=len(rest), gpu_ids=rest), "rest")
    quad = one(a, Claim(gpus=4), "quad")
    assert quad.gpus == (8, 9, 10, 11)
    assert "connected over NVLink, one model on NUMA node 0" in quad.score.explanation


def test_two_islands_eight_gpus_take_the_connected_island() -> None:
    """With GPU 15 taken, GPU 0 plus 8-14 has more NVLinks (378) than 0-7 (336) but is cut in two."""
    m = machine("two-islands-16")
    a = Allocator(m)
    one(a, Claim(gpus=1, gpu_ids=(15,)), "one")
    eight = one(a, Claim(gpus=8), "eight")
    assert eight.gpus == tuple(range(8))
    assert eight.score.nvlinks == 336


def test_a_disconnected_set_only_when_no_connected_one_is_free() -> None:
    m = machine("two-islands-16")
    a = Allocator(m)
    one(a, Claim(gpus=1, gpu_ids=(15,)), "one")
    one(a, Claim(gpus=1, gpu_ids=(7,)), "two")
    eight = one(a, Claim(gpus=8), "eight")
    assert "not connected over NVLink (no connected 8 are free)" in eight.score.explanation


# --- fractional packing ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["workstation-4x-pcie", "workstation-nvlink-pairs"])
def test_three_10gib_shares_binpack_on_one_a6000(name: str) -> None:
    a = Allocator(machine(name))
    placements = a.allocate(Claim(memory_mib=10 * GIB), ["a", "b", "c"], "ada")
    assert {p.gpus for p in placements} == {(0,)}
    assert all(p.devices[0] == DeviceShare(0, None, 10 * GIB, 0, False) for p in placements)


@pytest.mark.parametrize("name", ["workstation-4x-pcie", "workstation-nvlink-pairs"])
def test_three_10gib_shares_spread_on_three_gpus(name: str) -> None:
    a = Allocator(machine(name))
    placements = [one(a, Claim(memory_mib=10 * GIB, strategy=Strategy.SPREAD), gid) for gid in "abc"]
    assert len({p.gpus for p in placements}) == 3


def test_binpack_fills_the_tightest_shared_gpu_first() -> None:
    a = Allocator(machine("workstation-4x-pcie"))
    one(a, Claim(memory_mib=40 * GIB, gpu_ids=(0,)), "big")
    one(a, Claim(memory_mib=20 * GIB, gpu_ids=(1,)), "mid")
    assert one(a, Claim(memory_mib=7 * GIB), "small").gpus == (0,)
    assert one(a, Claim(memory_mib=10 * GIB), "more").gpus == (1,)


def test_binpack_keeps_room_for_the_share_sizes_in_use() -> None:
    """8 and 9 GiB free, 8 GiB shares live: 1 GiB goes where it leaves 8 and 8, so two more
    8 GiB shares fit; the tightest fit (8 -> 7, leaving 7 and 9) would refuse the second."""
    a = Allocator(build("pair", [16 * GIB] * 2, {}, lambda x, y: PIX))
    one(a, Claim(memory_mib=8 * GIB, gpu_ids=(0,)), "eight")
    one(a, Claim(memory_mib=7 * GIB, gpu_ids=(1,)), "seven")
    assert one(a, Claim(memory_mib=1 * GIB), "one").gpus == (1,)
    assert {one(a, Claim(memory_mib=8 * GIB), gid).gpus for gid in ("next", "after")} == {(0,), (1,)}


def test_share_without_memory_takes_the_default_share_not_the_gpu() -> None:
    a = Allocator(machine("workstation-4x-pcie"))
    share = one(a, Claim(compute_pct=30))
    assert share.devices[0].memory_mib == 49140 // 4 and share.devices[0].compute_pct == 30
    b = Allocator(machine("workstation-4x-pcie"), AllocatorConfig(default_share_mib=1000))
    assert one(b, Claim(compute_pct=30)).devices[0].memory_mib == 1000


def test_compute_is_capacity_too() -> None:
    a = Allocator(machine("workstation-4x-pcie"))
    placements = a.allocate(Claim(memory_mib=1024, compute_pct=60), ["a", "b"], "ada")
    assert placements[0].gpus != placements[1].gpus


def test_distinct_replicas_land_on_distinct_gpus() -> None:
    a = Allocator(machine("workstation-4x-pcie"))
    placements = a.allocate(Claim(memory_mib=1024, distinct=True), ["a", "b", "c", "d"], "ada")
    assert sorted(p.gpus[0] for p in placements) == [0, 1, 2, 3]
    with pytest.raises(NeverFits, match="distinct GPUs"):
        a.allocate(Claim(memory_mib=1024, distinct=True), list("efghi"), "ada")


def test_a_share_never_lands_on_a_whole_gpu_and_the_reverse() -> None:
    a = Allocator(machine("workstation-4x-pcie"))
    whole = a.allocate(Claim(gpus=1), ["w0", "w1", "w2"], "ada")
    share = one(a, Claim(memory_mib=1024), "s")
    assert share.gpus[0] not in {p.gpus[0] for p in whole}
    with pytest.raises(DoesNotFitNow, match="needs 1 whole GPU; 0 free"):
        one(a, Claim(gpus=1), "w3")


def test_a_refusal_names_the_groups_in_the_way_for_whoever_knows_their_owners() -> None:
    """The allocator knows groups, not people: it says which groups hold each GPU, and a caller
    that knows their owners words the same refusal with them."""
    a = Allocator(machine("workstation-4x-pcie"))
    a.allocate(Claim(gpus=2), ["train"], "train")
    a.set_unavailable([3])
    one(a, Claim(memory_mib=20 * GIB), "half", "serve")
    with pytest.raises(DoesNotFitNow) as info:
        one(a, Claim(gpus=2), "more")
    refusal = info.value
    assert str(refusal) == ("needs 2 whole GPUs; 0 free (not free: in use: GPUs 0-2; draining or unhealthy: GPU 3)")
    assert refusal.holders == {0: frozenset({"train"}), 1: frozenset({"train"}), 2: frozenset({"half"})}
    named = {g: f"{why} by {sorted(refusal.holders[g])[0]}" if g in refusal.holders else why
             for g, why in refusal.reasons.items()}
    assert refusal.worded(named) == ("needs 2 whole GPUs; 0 free (not free: in use by train: GPUs 0,1; "
                                     "in use by half: GPU 2; draining or unhealthy: GPU 3)")
    with pytest.raises(DoesNotFitNow) as info:
        a.allocate(Claim(memory_mib=40 * GIB), ["s0", "s1"], "shares")
    assert info.value.holders == {0: frozenset({"train"}), 1: frozenset({"train"}), 2: frozenset({"half"})}
    assert str(info.value).endswith("(group 1 of 2; the groups are placed all or nothing)")


# --- every simulated machine --------------------------------------------------------------------

@pytest.mark.parametrize("name", simulated_machine_names())
def test_every_machine_fills_up_and_empties(name: str) -> None:
    m = machine(name)
    a = Allocator(m)
    plain = [g.index for g in m.gpus if not g.mig_enabled]
    if not plain:
        with pytest.raises(NeverFits):
            one(a, Claim(gpus=1))
        return
    with pytest.raises(NeverFits, match=f"needs {len(plain) + 1} GPUs"):
        one(a, Claim(gpus=len(plain) + 1))
    with pytest.raises(NeverFits, match="on one GPU; the largest GPU"):
        one(a, Claim(memory_mib=max(g.memory_mib or 0 for g in m.gpus) + 1))
    everything = one(a, Claim(gpus=len(plain)), "all")
    assert everything.gpus == tuple(plain)
    with pytest.raises(DoesNotFitNow):
        one(a, Claim(memory_mib=1, compute_pct=1), "late")
    a.release("all")
    assert a.holdings() == ()
    assert a.free_summary() == Allocator(m).free_summary()


@pytest.mark.parametrize("name", [n for n in simulated_machine_names() if n != "cpu-only"])
def test_every_machine_places_each_kind_of_claim(name: str) -> None:
    m = machine(name)
    a = Allocator(m)
    one(a, Claim(gpus=1), "whole")
    one(a, Claim(memory_mib=1024, compute_pct=10), "share")
    one(a, Claim(gpus=min(2, len(m.gpus) - 1), colocate=DomainKind.NUMA), "numa")
    profiles = sorted({d.profile for g in m.gpus for d in g.mig_devices})
    if profiles:
        mig = one(a, Claim(mig=profiles[0]), "mig")
        assert mig.devices[0].mig_uuid is not None and mig.devices[0].whole
    for h in a.holdings():
        assert h.group_id in {"whole", "share", "numa", "mig"}


# --- MIG -----------------------------------------------------------------------------------------

def test_mig_gpus_take_only_mig_claims_and_plain_memory_shares() -> None:
    m = machine("dgx-a100-mig")
    mig_gpus = {g.index for g in m.gpus if g.mig_enabled}
    a = Allocator(m)
    wholes = a.allocate(Claim(gpus=len(m.gpus) - len(mig_gpus)), ["all"], "ada")[0]
    assert not set(wholes.gpus) & mig_gpus
    with pytest.raises(NeverFits, match="MIG enabled"):
        one(a, Claim(gpus=len(m.gpus)), "too-many")
    with pytest.raises(DoesNotFitNow, match="MIG enabled"):
        one(a, Claim(memory_mib=1024, compute_pct=10), "with-compute")
    small = min((d for g in m.gpus for d in g.mig_devices), key=lambda d: d.memory_mib or 0)
    share = one(a, Claim(memory_mib=small.memory_mib), "plain")
    assert share.devices[0].mig_uuid == small.uuid
    with pytest.raises(NeverFits, match=r"unknown MIG profile '9g\.99gb'.*profiles: "):
        one(a, Claim(mig="9g.99gb"), "bad")


def test_mig_instances_are_taken_once() -> None:
    m = machine("dgx-a100-mig")
    profile_count: dict[str, int] = {}
    for g in m.gpus:
        for d in g.mig_devices:
            profile_count[d.profile] = profile_count.get(d.profile, 0) + 1
    profile, count = max(profile_count.items(), key=lambda kv: kv[1])
    a = Allocator(m)
    placements = a.allocate(Claim(mig=profile), [f"m{i}" for i in range(count)], "ada")
    assert len({p.devices[0].mig_uuid for p in placements}) == count
    with pytest.raises(DoesNotFitNow, match=f"a free MIG {profile} instance"):
        one(a, Claim(mig=profile), "one-more")
    with pytest.raises(NeverFits):
        a.allocate(Claim(mig=profile), [f"x{i}" for i in range(count + 1)], "ada")


# --- placement rules ----------------------------------------------------------------------------

def test_colocation_failure_names_the_largest_free_island() -> None:
    a = Allocator(islands(2, 4))
    one(a, Claim(gpus=1, gpu_ids=(4,)), "x")
    one(a, Claim(gpus=2, gpu_ids=(0, 1)), "y")
    with pytest.raises(DoesNotFitNow) as info:
        one(a, Claim(gpus=4, colocate=DomainKind.NVLINK), "z")
    assert str(info.value) == "needs 4 NVLink-colocated GPUs; the largest free NVLink island has 3: GPUs 5-7"
    with pytest.raises(NeverFits, match="needs 5 NVLink-colocated GPUs; the largest NVLink island"):
        one(a, Claim(gpus=5, colocate=DomainKind.NVLINK), "z")


def test_colocate_keeps_the_set_in_one_domain() -> None:
    a = Allocator(machine("synthetic-72"))
    for kind in (DomainKind.NVLINK, DomainKind.PCIE, DomainKind.NUMA):
        for i in range(3):
            p = one(a, Claim(gpus=2, colocate=kind), f"{kind.value}{i}")
            assert p.domain is not None and set(p.gpus) <= p.domain
            assert p.domain in load_machine("synthetic-72").domains(kind)


def test_exclusive_domain_keeps_everyone_else_out() -> None:
    m = machine("dgx-h100")
    a = Allocator(m)
    p = one(a, Claim(gpus=1, exclusive=DomainKind.NUMA), "alone")
    assert p.exclusive_domain == m.domain_of(DomainKind.NUMA, p.gpus[0])
    others = a.allocate(Claim(gpus=1), ["b", "c", "d", "e"], "ada")
    assert not {q.gpus[0] for q in others} & p.exclusive_domain
    with pytest.raises(DoesNotFitNow, match="not usable: inside a domain another group holds exclusively"):
        one(a, Claim(memory_mib=1024), "f")
    a.release("b")
    with pytest.raises(DoesNotFitNow, match="every NUMA node has a group in it"):
        one(a, Claim(gpus=1, exclusive=DomainKind.NUMA), "g")
    a.release("alone")
    assert len(a.allocate(Claim(gpus=1), ["h", "i", "j", "k", "l"], "ada")) == 5


def test_exclusive_needs_an_unused_domain() -> None:
    a = Allocator(machine("dgx-h100"))
    one(a, Claim(memory_mib=1024, gpu_ids=(0,)), "s")
    p = one(a, Claim(gpus=2, exclusive=DomainKind.NUMA), "x")
    assert p.exclusive_domain == frozenset({4, 5, 6, 7})


def test_affinity_and_anti_affinity() -> None:
    m = machine("dgx-h100")
    a = Allocator(m)
    one(a, Claim(memory_mib=1024, gpu_ids=(5,)), "db")
    change(a, "db", users=frozenset({"db"}))
    near = one(a, Claim(memory_mib=1024, affinity=(AffinityTerm("db"),)), "cache")
    assert near.gpus == (5,)
    numa = one(a, Claim(gpus=2, affinity=(AffinityTerm("db", Level.NUMA),)), "etl")
    assert set(numa.gpus) <= {4, 5, 6, 7}
    far = one(a, Claim(gpus=1, anti_affinity=(AffinityTerm("db", Level.NUMA),)), "web")
    assert far.gpus[0] in {0, 1, 2, 3}
    away = one(a, Claim(memory_mib=1024, anti_affinity=(AffinityTerm("db"),)), "other")
    assert away.gpus != (5,)
    with pytest.raises(DoesNotFitNow, match=r"not on the same GPU as ghost \(affinity\)"):
        one(a, Claim(memory_mib=1024, affinity=(AffinityTerm("ghost"),)), "lonely")


def test_pools_and_pinned_gpus() -> None:
    config = AllocatorConfig(pools={"fast": frozenset({6, 7})})
    a = Allocator(machine("dgx-h100"), config)
    assert set(one(a, Claim(gpus=2, pool="fast"), "x").gpus) == {6, 7}
    with pytest.raises(DoesNotFitNow):
        one(a, Claim(gpus=1, pool="fast"), "y")
    with pytest.raises(NeverFits, match="unknown pool 'slow' \\(pools: fast\\)"):
        one(a, Claim(gpus=1, pool="slow"), "y")
    with pytest.raises(NeverFits, match="needs 3 GPUs; pool 'fast' has 2"):
        one(a, Claim(gpus=3, pool="fast"), "y")
    assert one(a, Claim(gpus=1, gpu_ids=(3,)), "pinned").gpus == (3,)
    with pytest.raises(NeverFits, match="gpu_ids names GPU 9"):
        one(a, Claim(gpus=1, gpu_ids=(9,)), "z")


def test_draining_and_foreign_processes() -> None:
    a = Allocator(machine("workstation-4x-pcie"))
    a.set_unavailable([0, 1])
    a.set_foreign({2: 45000})
    assert one(a, Claim(gpus=1), "w").gpus == (3,)
    with pytest.raises(DoesNotFitNow) as info:
        one(a, Claim(gpus=1), "x")
    assert "draining or unhealthy: GPUs 0,1" in str(info.value)
    assert "allow_busy" in str(info.value)
    assert one(a, Claim(gpus=1, allow_busy=True), "busy").gpus == (2,)
    a.release("busy")
    with pytest.raises(DoesNotFitNow, match=r"the most free is 4\.04 GiB"):
        one(a, Claim(memory_mib=5000), "share")
    assert one(a, Claim(memory_mib=4000), "share").gpus == (2,)
    use = {u.gpu: u for u in a.free_summary()}
    assert use[2].memory_foreign_mib == 45000 and use[2].memory_free_mib == 140
    assert not use[0].available and not use[0].whole_free


# --- priority and reservations ---------------------------------------------------------------

def test_higher_priority_displaces_reservations_only() -> None:
    a = Allocator(machine("dgx-h100"))
    a.allocate(Claim(gpus=4), ["res"], "ada", reserved=True)
    a.allocate(Claim(gpus=4), ["run"], "bob")
    with pytest.raises(DoesNotFitNow):
        one(a, Claim(gpus=2), "same-priority")
    before = a.holdings()
    p = one(a, Claim(gpus=2, priority=1), "urgent")
    assert p.displaced == ("res",)
    assert {h.group_id for h in a.holdings()} == {"run", "urgent"}
    assert len(before) == 2
    with pytest.raises(DoesNotFitNow):
        one(a, Claim(gpus=4, priority=9), "greedy")


def test_taken_reservations_are_no_longer_displaceable() -> None:
    a = Allocator(machine("dgx-h100"))
    a.allocate(Claim(gpus=8), ["res"], "ada", reserved=True)
    change(a, "res", reserved=False)
    with pytest.raises(DoesNotFitNow):
        one(a, Claim(gpus=1, priority=5), "urgent")
    assert not a.holdings()[0].reserved


def test_displacing_a_share_takes_only_what_is_needed() -> None:
    a = Allocator(machine("workstation-4x-pcie"))
    a.allocate(Claim(memory_mib=20 * GIB, priority=0), ["r0", "r1"], "ada", reserved=True)
    a.allocate(Claim(gpus=1), ["w1", "w2", "w3"], "bob")
    p = one(a, Claim(memory_mib=20 * GIB, priority=3), "urgent")
    assert p.displaced == ("r0",)


# --- bookkeeping --------------------------------------------------------------------------------

def test_failed_batch_changes_nothing() -> None:
    a = Allocator(machine("dgx-h100"))
    a.allocate(Claim(gpus=2), ["a"], "ada")
    before = (a.holdings(), a.free_summary())
    with pytest.raises(DoesNotFitNow, match=r"group 4 of 4"):
        a.allocate(Claim(gpus=2), ["b", "c", "d", "e"], "ada")
    assert (a.holdings(), a.free_summary()) == before


def test_group_ids_must_be_new_and_unique() -> None:
    a = Allocator(machine("dgx-h100"))
    one(a, Claim(gpus=1), "a")
    with pytest.raises(ValueError, match="already placed"):
        one(a, Claim(gpus=1), "a")
    with pytest.raises(ValueError, match="twice"):
        a.allocate(Claim(gpus=1), ["b", "b"], "ada")
    with pytest.raises(KeyError):
        a.release("nope")


def test_following_holdings_rebuilds_the_same_state() -> None:
    m = machine("synthetic-72")
    a = Allocator(m)
    a.allocate(Claim(gpus=4, colocate=DomainKind.NVLINK), ["a", "b"], "ada")
    a.allocate(Claim(memory_mib=4096), ["c", "d", "e"], "bob", reserved=True)
    a.allocate(Claim(gpus=1, exclusive=DomainKind.PCIE), ["f"], "cy")
    change(a, "a", users=frozenset({"web", "shadow"}))
    b = Allocator(m)
    follow(b, a.holdings())
    assert b.holdings() == a.holdings()
    assert b.free_summary() == a.free_summary()
    claim = Claim(gpus=2)
    assert b.allocate(claim, ["next"], "ada") == a.allocate(claim, ["next"], "ada")


def test_following_accepts_more_than_fits() -> None:
    m = machine("workstation-4x-pcie")
    whole = (DeviceShare(0, None, 49140, 100, True),)
    a = Allocator(m)
    follow(a, [Holding("x", whole, "ada"), Holding("y", whole, "bob"),
               Holding("z", (DeviceShare(9, None, 1, 1, False),), "gone")])
    use = a.free_summary()[0]
    assert use.memory_free_mib == 0 and set(use.groups) == {"x", "y"}
    a.release("x")
    a.release("z")
    with pytest.raises(DoesNotFitNow):
        one(a, Claim(gpus=1, gpu_ids=(0,)), "w")


def test_same_inputs_same_answers() -> None:
    def run() -> list:
        a = Allocator(machine("synthetic-72"))
        out = []
        for i, claim in enumerate([Claim(gpus=3), Claim(memory_mib=5000), Claim(gpus=8),
                                   Claim(gpus=2, strategy=Strategy.SPREAD), Claim(compute_pct=50, distinct=True)]):
            out.append(a.allocate(claim, [f"g{i}", f"h{i}"], "ada"))
        return out

    assert run() == run()


def test_errors_are_placement_errors() -> None:
    assert issubclass(NeverFits, PlacementError) and issubclass(DoesNotFitNow, PlacementError)
    with pytest.raises(NeverFits):
        one(Allocator(machine("cpu-only")), Claim(memory_mib=1))


def test_a_claim_without_strategy_takes_the_configured_default() -> None:
    machine = load_machine("workstation-4x-pcie")
    shares = [Claim(memory_mib=10240) for _ in range(3)]
    spread = Allocator(machine, AllocatorConfig(default_strategy=Strategy.SPREAD))
    packed = Allocator(machine, AllocatorConfig())
    spread_gpus = {spread.allocate(c, [f"s{i}"], "x")[0].devices[0].gpu for i, c in enumerate(shares)}
    packed_gpus = {packed.allocate(c, [f"p{i}"], "x")[0].devices[0].gpu for i, c in enumerate(shares)}
    assert len(spread_gpus) == 3 and len(packed_gpus) == 1


# --- issue 15: rules that contradict, and MIG instances for plain shares ------------------------

def test_exclusive_and_colocate_that_contradict_are_refused_with_why() -> None:
    """NVLink islands 0-3 and 4-7, NUMA nodes of the even and the odd GPUs: no island meets a node in 4."""

    nv = {(a, b): 12 for a in range(8) for b in range(a + 1, 8) if a // 4 == b // 4}
    m = build("crossed", [81559] * 8, nv, lambda a, b: PIX, numa=lambda g: g % 2)
    a = Allocator(m)
    with pytest.raises(NeverFits, match=r"^exclusive numa and colocate nvlink contradict on this machine: "
                                        r"needs 4 GPUs in one NUMA node and one NVLink island; the most any "
                                        r"NUMA node and NVLink island share is 2$"):
        one(a, Claim(gpus=4, exclusive=DomainKind.NUMA, colocate=DomainKind.NVLINK))
    assert one(a, Claim(gpus=2, exclusive=DomainKind.NUMA, colocate=DomainKind.NVLINK)).gpus == (0, 2)


def test_a_plain_memory_share_takes_a_gpu_share_before_a_mig_instance() -> None:
    m = machine("dgx-a100-mig")
    a = Allocator(m)
    small = min((d for g in m.gpus for d in g.mig_devices), key=lambda d: d.memory_mib or 0)
    share = one(a, Claim(memory_mib=small.memory_mib), "plain")
    assert share.devices[0].mig_uuid is None and not share.devices[0].whole
    instance = one(a, Claim(mig=small.profile), "asked")
    assert instance.devices[0].mig_uuid is not None


def test_a_plain_share_that_needs_a_mig_instance_takes_the_smallest_that_fits() -> None:
    """With the plain GPUs full, the 1g instance on GPU 7 rather than a 2g one beside a used 3g."""
    m = machine("dgx-a100-mig")
    a = Allocator(m)
    one(a, Claim(gpus=6), "all")
    one(a, Claim(mig="3g.20gb"), "big")
    share = one(a, Claim(memory_mib=4 * GIB), "plain")
    assert share.gpus == (7,) and "1g.5gb" in share.score.explanation


def test_anti_affinity_right_after_the_group_it_avoids() -> None:
    """`allocate X` then `--anti-affinity X`: the second claim sees X's group as soon as its record has users."""
    a = Allocator(machine("dgx1-v100"))
    x = one(a, Claim(gpus=2), "x-0")
    change(a, "x-0", users=frozenset({"x"}))
    y = one(a, Claim(gpus=2, anti_affinity=(AffinityTerm("x", Level.NUMA),)), "y-0")
    assert x.gpus == (0, 3) and y.gpus == (4, 7)
    assert "leaves 1,2,5,6 as a 7-link quad" in y.score.explanation


def test_memory_in_messages_is_in_gib_throughout() -> None:
    """A claim written in GiB is told in GiB, beside the GPUs' odd sizes: never 90 GiB against 81559 MiB,
    and a free amount just under what is asked never reads as equal to it."""
    a = Allocator(machine("dgx-h100"))
    with pytest.raises(NeverFits, match=r"needs 90 GiB on one GPU; the largest GPU .* has 79\.64 GiB$"):
        one(a, Claim(memory_mib=90 * 1024))
    one(a, Claim(gpus=7), "seven")
    one(a, Claim(memory_mib=81559 - 8191), "most")
    with pytest.raises(DoesNotFitNow, match=r"needs 8 GiB on one GPU; none is free now; the most free is 7\.99 GiB "):
        one(a, Claim(memory_mib=8 * 1024))
