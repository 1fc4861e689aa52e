"""Deployment files: every refusal names the file, the path and the problem;
claims and sharing are immutable; scaling and re-applying keep counts right."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

import pytest

from computegroups.daemon.model.deployment import (
    DeploymentError,
    DeploymentSpec,
    check_immutable,
    parse,
)

EXAMPLE = Path(__file__).parents[3] / "docs" / "examples" / "grove-sharing.toml"


def example() -> dict[str, Any]:
    return tomllib.loads(EXAMPLE.read_text())


def changed(edit: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    data = example()
    edit(data)
    return data


def component(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in data["components"] if c["name"] == name)


def test_the_example_parses_and_round_trips_through_the_state_form() -> None:
    spec = parse(example(), "grove.toml")
    assert spec.name == "rs" and spec.replicas == 1
    assert [c.name for c in spec.claims][:2] == ["set-pool", "set-slot"]
    assert spec.claim("set-slot").memory_mib == 2048
    assert spec.claim("rank").compute_pct == 5
    assert spec.group_of("worker-b") == "sga" and spec.group_of("worker-a") is None
    assert spec.component("worker-a-standby").shadow_of == "worker-a"
    assert spec.sizes[0].scaling_groups == {"sga": 2}
    assert parse(spec.file_dict()) == spec
    scaled = spec.scaled(None, 2).scaled("sga", 3)
    assert DeploymentSpec.from_dict(scaled.to_dict()) == scaled


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["sharing"][2]["filter"].update(components=["nope"]),
         "grove.toml: sharing[2].filter.components[0]: no component named 'nope' in this file"),
        (lambda d: d["sharing"][3]["filter"].update(scaling_groups=["sgb"]),
         "grove.toml: sharing[3].filter.scaling_groups[0]: no scaling group named 'sgb'"),
        (lambda d: d["scaling_groups"][0]["sharing"][2]["filter"].update(components=["worker-a"]),
         ("grove.toml: scaling_groups[0].sharing[2].filter.components[0]: 'worker-a' is not a component "
          "of scaling group 'sga'")),
        (lambda d: d["sharing"][2].update(filter={}),
         "grove.toml: sharing[2].filter: a filter must name at least one child"),
        (lambda d: d["sharing"][2].update(filter={"components": [], "scaling_groups": []}),
         "grove.toml: sharing[2].filter: a filter must name at least one child"),
        (lambda d: d["scaling_groups"][0]["sharing"].append({"claim": "kv", "scope": "per-replica"}),
         "grove.toml: scaling_groups[0].sharing[3].claim: duplicate claim 'kv' in this list"),
        (lambda d: d["sharing"][0].update(scope="AllReplicas"),
         "grove.toml: sharing[0].scope: must be one of per-replica, all-replicas, got 'AllReplicas'"),
        (lambda d: component(d, "worker-a")["sharing"][0].update(filter={"components": ["worker-a"]}),
         "grove.toml: components[0].sharing[0].filter: component-level sharing has no filter"),
        (lambda d: d["scaling_groups"][0]["sharing"][2]["filter"].update(scaling_groups=["sga"]),
         "grove.toml: scaling_groups[0].sharing[2].filter.scaling_groups: unknown field (known: components)"),
        (lambda d: d["sharing"].append({"claim": "gpu", "scope": "per-replica"}),
         "grove.toml: sharing[4].claim: no claim named 'gpu' in [[claims]]"),
        (lambda d: d["sharing"][2]["filter"].update(components=["worker-a-standby"]),
         "grove.toml: sharing[2].filter.components[0]: 'worker-a-standby' is a shadow of 'worker-a'"),
        (lambda d: d["claims"][1].update(memory="lots"), "grove.toml: claims[1].memory: not a size: 'lots'"),
        (lambda d: d["claims"][0].update(memory_mib=5),
         "grove.toml: claims[0].memory_mib: unknown field (known: gpus, memory, compute"),
        (lambda d: d["claims"][0].update(gpus=1, memory="1GiB"), "grove.toml: claims[0]: gpus and memory_mib"),
        (lambda d: d["claims"].append({"name": "kv", "gpus": 1}), "grove.toml: claims[10].name: duplicate claim 'kv'"),
        (lambda d: d["components"].append({"name": "worker-b"}),
         "grove.toml: components[4].name: duplicate component 'worker-b'"),
        (lambda d: d["scaling_groups"].append({"name": "sgb", "components": ["worker-b"]}),
         "grove.toml: scaling_groups[1].components[0]: 'worker-b' is already in scaling group 'sga'"),
        (lambda d: d["scaling_groups"].append({"name": "worker-a", "components": ["worker-a"]}),
         "grove.toml: scaling_groups[1].name: 'worker-a' is also a component"),
        (lambda d: d["scaling_groups"][0].update(components=["worker-z"]),
         "grove.toml: scaling_groups[0].components[0]: no component named 'worker-z' in this file"),
        (lambda d: d["scaling_groups"][0].update(components=["worker-b", "worker-c", "worker-a-standby"]),
         "grove.toml: components[1].shadow_of: 'worker-a-standby' and 'worker-a' must be in the same scaling group"),
        (lambda d: d["components"].append({"name": "double", "shadow_of": "worker-a-standby"}),
         "grove.toml: components[4].shadow_of: 'worker-a-standby' is itself a shadow"),
        (lambda d: component(d, "worker-a-standby").update(replicas=2),
         "grove.toml: components[1].replicas: not allowed with shadow_of"),
        (lambda d: component(d, "worker-a-standby").update(sharing=[]),
         "grove.toml: components[1].sharing: not allowed with shadow_of"),
        (lambda d: component(d, "worker-a").update(env={"CUDA_VISIBLE_DEVICES": "0"}),
         "grove.toml: components[0].env.CUDA_VISIBLE_DEVICES: "
         "CG_*, CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER and CUDA_MPS_* are set by cgd"),
        (lambda d: component(d, "worker-a").update(cwd="relative/dir"),
         "grove.toml: components[0].cwd: 'relative/dir' is not an absolute path"),
        (lambda d: component(d, "worker-a").update(replicas=-1),
         "grove.toml: components[0].replicas: must be between 0 and 1024, got -1"),
        (lambda d: component(d, "worker-a").update(colour="red"),
         "grove.toml: components[0].colour: unknown field"),
        (lambda d: component(d, "worker-a").update(image="example/a 1"),
         "grove.toml: components[0].image: expected a container image reference (no spaces), got 'example/a 1'"),
        (lambda d: component(d, "worker-a").update(image=""),
         "grove.toml: components[0].image: "),
        (lambda d: component(d, "worker-a").update(time_limit_s=0),
         "grove.toml: components[0].time_limit_s: "),
        (lambda d: d.update(name="Grove"), "grove.toml: name: 'Grove' is not a valid name"),
        (lambda d: d.update(components=[]), "grove.toml: components: a deployment needs at least one component"),
    ],
)
def test_refusals_name_the_file_the_path_and_the_problem(edit: Callable[[dict[str, Any]], Any],
                                                         message: str) -> None:
    with pytest.raises(DeploymentError) as refused:
        parse(changed(edit), "grove.toml")
    assert str(refused.value).startswith(message), str(refused.value)


def test_a_component_may_name_its_image_and_time_limit() -> None:
    spec = parse(changed(lambda d: component(d, "worker-a").update(image="example/a:1", time_limit_s=600)))
    worker = spec.component("worker-a")
    assert (worker.image, worker.time_limit_s) == ("example/a:1", 600)
    assert worker.request("rs-0-worker-a", None).time_limit_s == 600, "cgd holds the limit too"
    assert spec.component("worker-b").image is None and spec.component("worker-b").time_limit_s is None
    assert parse(spec.file_dict()) == spec
    assert DeploymentSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize(
    ("edit", "path"),
    [
        (lambda d: d["claims"][1].update(memory="3GiB"), "claims[1].memory"),
        (lambda d: d["claims"][0].update(colocate="nvlink"), "claims[0].colocate"),
        (lambda d: d["claims"].append({"name": "more", "gpus": 1}), "claims"),
        (lambda d: d["sharing"][2]["filter"].update(components=["worker-b"]), "sharing[2].filter.components[0]"),
        (lambda d: d["sharing"][0].update(scope="per-replica"), "sharing[0].scope"),
        (lambda d: d["scaling_groups"][0]["sharing"][1].update(scope="all-replicas"),
         "scaling_groups[0].sharing[1].scope"),
        (lambda d: component(d, "worker-b")["sharing"].append({"claim": "kv", "scope": "all-replicas"}),
         "components[2].sharing"),
    ],
)
def test_claims_and_sharing_are_immutable(edit: Callable[[dict[str, Any]], Any], path: str) -> None:
    old = parse(example())
    with pytest.raises(DeploymentError) as refused:
        check_immutable(old, parse(changed(edit)), "grove.toml")
    assert str(refused.value).startswith(f"grove.toml: field is immutable: {path} ("), str(refused.value)


INCLUDED = {"claims/gpu.toml": {"claims": [{"name": "kv", "memory": "2GiB"}, {"name": "rank", "memory": "1GiB"}]}}


def with_include(own: list[dict[str, Any]], included: dict[str, Any] = INCLUDED) -> DeploymentSpec:
    return parse({"name": "inc", "include": list(included), "claims": own,
                  "components": [{"name": "w", "command": ["x"], "sharing": [
                      {"claim": c["name"], "scope": "per-replica"} for c in own]}]}, "sel.toml", included)


def test_a_claim_is_named_by_its_own_file_and_index() -> None:
    spec = with_include([{"name": "own", "gpus": 1}])
    assert [spec.locate(f"claims[{i}].memory", "sel.toml") for i in range(3)] == [
        ("claims/gpu.toml", "claims[0].memory"), ("claims/gpu.toml", "claims[1].memory"),
        ("sel.toml", "claims[0].memory")]
    assert spec.locate("components[0].name", "sel.toml") == ("sel.toml", "components[0].name")
    with pytest.raises(DeploymentError, match=r"^sel\.toml: claims\[0\]\.memory: not a size"):
        with_include([{"name": "own", "memory": "lots"}])
    changed_included = {"claims/gpu.toml": {"claims": [{"name": "kv", "memory": "2GiB"},
                                                       {"name": "rank", "memory": "3GiB"}]}}
    with pytest.raises(DeploymentError, match=r"^claims/gpu\.toml: field is immutable: claims\[1\]\.memory \("):
        check_immutable(spec, with_include([{"name": "own", "gpus": 1}], changed_included), "sel.toml")
    with pytest.raises(DeploymentError, match=r"^sel\.toml: field is immutable: claims\[0\]\.gpus \("):
        check_immutable(spec, with_include([{"name": "own", "gpus": 2}]), "sel.toml")
    assert DeploymentSpec.from_dict(spec.to_dict()) == spec, "the state form keeps where each claim came from"


def test_replica_counts_commands_and_new_components_may_change() -> None:
    old = parse(example())

    def edit(d: dict[str, Any]) -> None:
        d["replicas"] = 3
        d["scaling_groups"][0]["replicas"] = 5
        component(d, "worker-a")["command"] = ["sleep", "60"]
        d["components"].append({"name": "extra", "command": ["sleep", "1"]})

    check_immutable(old, parse(changed(edit)))


def test_scaling_changes_every_set_replica_and_new_set_replicas_start_from_the_file() -> None:
    spec = parse(example()).scaled("sga", 3)
    assert [s.scaling_groups["sga"] for s in spec.sizes] == [3]
    spec = spec.scaled(None, 2)
    assert [s.scaling_groups["sga"] for s in spec.sizes] == [3, 2]
    spec = spec.scaled("worker-b", 4)
    assert [s.components["worker-b"] for s in spec.sizes] == [4, 4]
    assert len(spec.scaled(None, 0).sizes) == 0
    with pytest.raises(LookupError):
        spec.scaled("nope", 1)
    with pytest.raises(DeploymentError, match="'worker-a-standby' is a shadow of 'worker-a': scale 'worker-a'"):
        spec.scaled("worker-a-standby", 2)


def test_reapplying_keeps_scaled_counts_unless_the_file_changes_them() -> None:
    running = parse(example()).scaled("sga", 3).scaled("worker-a", 2)
    same = parse(example()).carry_sizes(running)
    assert same.sizes == running.sizes

    def edit(d: dict[str, Any]) -> None:
        d["scaling_groups"][0]["replicas"] = 4
        d["replicas"] = 2

    moved = parse(changed(edit)).carry_sizes(running)
    assert [s.scaling_groups["sga"] for s in moved.sizes] == [4, 4]
    assert [s.components["worker-a"] for s in moved.sizes] == [2, 1]


def test_the_state_form_is_the_files_spelling() -> None:
    stored = parse(example()).to_dict()
    claims = {c["name"]: c for c in stored["file"]["claims"]}
    assert claims["rank"] == {"name": "rank", "memory": 1024, "compute": 5}
    assert stored["sizes"] == [{"scaling_groups": {"sga": 2},
                                "components": {"worker-a": 1, "worker-b": 1, "worker-c": 1}}]
    assert copy.deepcopy(stored) == DeploymentSpec.from_dict(stored).to_dict()
