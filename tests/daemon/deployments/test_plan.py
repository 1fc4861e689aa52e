"""The plan of a deployment: Grove's names, counts through the seed scenario,
who uses which group, and every collision refused with both paths."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

import pytest

from computegroups.daemon.deployments.plan import expand, sibling_claim
from computegroups.daemon.model.deployment import DeploymentError, DeploymentSpec, parse

EXAMPLE = Path(__file__).parents[3] / "docs" / "examples" / "grove-sharing.toml"

INITIAL = [
    "rs-0-a-slot", "rs-0-set-slot", "rs-0-sga-0-rank", "rs-0-sga-0-worker-b-all-b-common", "rs-0-sga-1-rank",
    "rs-0-sga-1-worker-b-all-b-common", "rs-0-sga-all-b-cache", "rs-0-sga-all-kv", "rs-0-worker-a-0-a-rank",
    "rs-0-worker-a-all-a-common", "rs-all-set-pool", "rs-all-sga-pool",
]


def example() -> DeploymentSpec:
    return parse(tomllib.loads(EXAMPLE.read_text()))


def tiny(**extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"name": "a", "claims": [{"name": "x", "memory": 1024}],
                            "components": [{"name": "w"}]}
    data.update(extra)
    return data


def test_the_seed_scenario_makes_grove_s_twelve_groups() -> None:
    plan = expand(example())
    assert sorted(plan.groups) == INITIAL
    assert sorted(plan.instances) == [
        "rs-0-sga-0-worker-b", "rs-0-sga-0-worker-c", "rs-0-sga-1-worker-b", "rs-0-sga-1-worker-c",
        "rs-0-worker-a", "rs-0-worker-a-standby",
    ]
    g = plan.groups["rs-0-sga-1-rank"]
    assert (g.owner, g.scope, g.replica, g.claim) == ("rs-0-sga", "per-replica", 1, "rank")
    assert plan.groups["rs-all-set-pool"].replica is None
    assert plan.owners == {"rs", "rs-0-sga", *plan.instances}


# Each step of Grove's Test_RS1_HierarchicalResourceSharing: (target, replicas, groups after it).
SCENARIO = [
    ("sga", 1, 10), ("sga", 3, 14), ("worker-a", 2, 15), ("worker-a", 1, 14), (None, 2, 24), (None, 1, 14),
]


def test_every_scaling_step_gives_grove_s_counts_and_removes_exactly_the_replicas_groups() -> None:
    spec = example()
    before = set(expand(spec).groups)
    for target, replicas, count in SCENARIO:
        spec = spec.scaled(target, replicas)
        after = set(expand(spec).groups)
        assert len(after) == count, (target, replicas)
        if count < len(before):
            assert before - after and after <= before, "scale-in only removes"
        else:
            assert before <= after, "scale-out only adds"
        before = after
    assert before == set(expand(example().scaled("sga", 3)).groups)


def test_scaling_steps_change_exactly_the_per_replica_groups() -> None:
    spec = example()
    assert set(expand(spec).groups) - set(expand(spec.scaled("sga", 1)).groups) == {
        "rs-0-sga-1-rank", "rs-0-sga-1-worker-b-all-b-common"}
    grown = set(expand(spec.scaled("sga", 3)).groups) - set(expand(spec).groups)
    assert grown == {"rs-0-sga-2-rank", "rs-0-sga-2-worker-b-all-b-common"}
    assert set(expand(spec.scaled("worker-a", 2)).groups) - set(expand(spec).groups) == {"rs-0-worker-a-1-a-rank"}
    two = set(expand(spec.scaled("sga", 3).scaled(None, 2)).groups)
    assert sorted(g for g in two if g.startswith("rs-1-")) == [
        "rs-1-a-slot", "rs-1-set-slot", "rs-1-sga-0-rank", "rs-1-sga-0-worker-b-all-b-common", "rs-1-sga-1-rank",
        "rs-1-sga-1-worker-b-all-b-common", "rs-1-sga-all-b-cache", "rs-1-sga-all-kv", "rs-1-worker-a-0-a-rank",
        "rs-1-worker-a-all-a-common",
    ], "a new set replica starts from the file: sga has 2 replicas there"


def test_each_replica_gets_the_groups_of_every_level_that_targets_it() -> None:
    uses = expand(example().scaled(None, 2)).groups_of()
    assert uses["rs-0-worker-a/0"] == (
        "rs-0-a-slot", "rs-0-set-slot", "rs-0-worker-a-0-a-rank", "rs-0-worker-a-all-a-common", "rs-all-set-pool")
    assert uses["rs-0-sga-1-worker-b/0"] == (
        "rs-0-set-slot", "rs-0-sga-1-rank", "rs-0-sga-1-worker-b-all-b-common", "rs-0-sga-all-b-cache",
        "rs-0-sga-all-kv", "rs-all-set-pool", "rs-all-sga-pool")
    assert uses["rs-1-sga-0-worker-c/0"] == (
        "rs-1-set-slot", "rs-1-sga-0-rank", "rs-1-sga-all-kv", "rs-all-set-pool", "rs-all-sga-pool"), \
        "the scaling group's filter leaves worker-c out of b-cache"
    assert uses["rs-1-worker-a-standby/0"] == uses["rs-1-worker-a/0"], "a shadow sits on its primary's groups"


def test_a_set_scaled_to_zero_keeps_only_its_all_replicas_groups() -> None:
    plan = expand(example().scaled(None, 0))
    assert sorted(plan.groups) == ["rs-all-set-pool", "rs-all-sga-pool"]
    assert not plan.instances and all(not g.users for g in plan.groups.values())


def test_a_shadow_follows_its_primary_s_replica_count() -> None:
    plan = expand(example().scaled("worker-a", 3))
    assert plan.instances["rs-0-worker-a-standby"].replicas == 3
    assert plan.instances["rs-0-worker-a-standby"].shadow_of == "rs-0-worker-a"


def test_colliding_instance_names_are_refused_with_both_paths() -> None:
    data = tiny(components=[{"name": "x"}, {"name": "g-0-x"}], scaling_groups=[{"name": "g", "components": ["x"]}])
    with pytest.raises(DeploymentError) as refused:
        expand(parse(data))
    message = str(refused.value)
    assert "'a-0-g-0-x'" in message
    assert "components[1] (set replica 0)" in message
    assert "components[0] (set replica 0, scaling group 'g' replica 0)" in message


def test_colliding_group_names_are_refused_with_both_paths() -> None:
    data = tiny(claims=[{"name": "x", "memory": 1}, {"name": "0-x", "memory": 1}],
                components=[{"name": "w", "sharing": [{"claim": "0-x", "scope": "per-replica"}]},
                            {"name": "w-0", "sharing": [{"claim": "x", "scope": "per-replica"}]}])
    with pytest.raises(DeploymentError) as refused:
        expand(parse(data))
    message = str(refused.value)
    assert "group name 'a-0-w-0-0-x'" in message
    assert "components[1].sharing[0] (owner 'a-0-w-0', claim 'x')" in message
    assert "components[0].sharing[0] (owner 'a-0-w', claim '0-x')" in message


def test_a_generated_name_longer_than_63_is_refused_with_its_path() -> None:
    long = "c" * 40
    data = tiny(claims=[{"name": long, "memory": 1}],
                components=[{"name": "w" * 20, "sharing": [{"claim": long, "scope": "all-replicas"}]}])
    with pytest.raises(DeploymentError, match=r"^components\[0\]\.sharing\[0\]: the group name 'a-0-w+-all-c+' "
                                              r"generated for .* has 69 characters, more than 63"):
        expand(parse(data))
    with pytest.raises(DeploymentError, match=r"^components\[0\]: the component instance name"):
        expand(parse(tiny(components=[{"name": "w" * 62}])))


def test_a_component_without_sharing_or_targets_makes_no_group() -> None:
    plan = expand(parse(tiny(replicas=2)))
    assert sorted(plan.instances) == ["a-0-w", "a-1-w"] and not plan.groups
    assert plan.groups_of() == {"a-0-w/0": (), "a-1-w/0": ()}


def test_an_affinity_to_a_sibling_resolves_beside_each_group() -> None:
    """LeaderWorkerSet: a claim's affinity to a component of the file means the instance in the same set
    replica, and, for a component of a scaling group, in the same scaling-group replica."""
    near = {"name": "near", "memory": 1024, "affinity": [{"component": "leader", "level": "nvlink"}]}
    with_b = {"name": "with-b", "memory": 1024, "anti_affinity": [{"component": "b", "level": "device"}]}
    spec = parse({
        "name": "s", "replicas": 2, "claims": [{"name": "x", "memory": 1024}, near, with_b],
        "components": [{"name": "leader", "sharing": [{"claim": "x", "scope": "per-replica"}]},
                       {"name": "worker", "sharing": [{"claim": "near", "scope": "per-replica"}]},
                       {"name": "b"}, {"name": "c", "sharing": [{"claim": "with-b", "scope": "all-replicas"}]}],
        "scaling_groups": [{"name": "g", "components": ["b", "c"], "replicas": 2,
                            "sharing": [{"claim": "with-b", "scope": "per-replica"}]}],
    })
    plan = expand(spec)

    def resolved(gid: str) -> list[tuple[str, str]]:
        claim = sibling_claim(spec, plan.groups[gid], spec.claim(plan.groups[gid].claim))
        return [(t.component, str(t.level)) for t in (*claim.affinity, *claim.anti_affinity)]

    assert resolved("s-1-worker-0-near") == [("s-1-leader", "nvlink")]
    assert resolved("s-0-g-1-with-b") == [("s-0-g-1-b", "device")]
    assert resolved("s-1-g-0-c-all-with-b") == [("s-1-g-0-b", "device")]
    outside = parse({**spec.file.to_dict(), "sharing": [{"claim": "with-b", "scope": "per-replica"}]})
    gid = "s-0-with-b"
    with pytest.raises(DeploymentError, match="'b' is in scaling group 'g': only a group inside a replica"):
        sibling_claim(outside, expand(outside).groups[gid], outside.claim("with-b"))
