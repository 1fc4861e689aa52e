"""Every rendered manifest against the schemas a cluster would check it with, offline and strictly.

- The PodCliqueSet against tests/kubernetes/schemas/podcliqueset.schema.json,
  made field by field from the CRD of ai-dynamo/grove v0.1.0-alpha.11 with
  unknown fields refused (make_podcliqueset_schema.py beside it says how).
- What Kubernetes itself defines, against Kubernetes 1.37's OpenAPI schemas
  in strict mode (`kubernetes-validate`, pinned): each claim template as a
  `resource.k8s.io/v1` ResourceClaimTemplate, each clique's pod as a `v1`
  Pod, so the DRA and pod fields are those of 1.37, not only those the
  Grove release copied from an older Kubernetes.

Each validator is shown to refuse a wrong field name, so a pass means something.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from computegroups.daemon.kubernetes.render import render_deployment
from computegroups.daemon.model.deployment import DeploymentSpec, parse
from tests.kubernetes.render_samples import EVERY_KIND, IMAGE, SELECTORS, example

KUBERNETES = "1.37"
SCHEMA = Path(__file__).with_name("schemas") / "podcliqueset.schema.json"
Doc = dict[str, Any]


@cache
def grove_validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def grove_errors(pcs: Doc) -> list[str]:
    return [f"{e.json_path}: {e.message}" for e in grove_validator().iter_errors(pcs)]


def kubernetes_objects(pcs: Doc) -> list[Doc]:
    """What Kubernetes will create from the set, as objects of its own API: claim templates and pods."""
    meta = {"namespace": pcs["metadata"]["namespace"]}
    template = pcs["spec"]["template"]
    claims = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
               "metadata": {**meta, "name": t["name"]}, "spec": t["templateSpec"]}
              for t in template.get("resourceClaimTemplates", [])]
    pods = [{"apiVersion": "v1", "kind": "Pod", "metadata": {**meta, "name": c["name"], "labels": c["labels"]},
             "spec": c["spec"]["podSpec"]} for c in template["cliques"]]
    return claims + pods


def strict_kubernetes(doc: Doc) -> None:
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


SPECS = {
    "grove-sharing": example,
    "every-kind": lambda: parse(EVERY_KIND),
    "selectors": lambda: parse(SELECTORS),
    "shadow-in-a-group": lambda: parse({
        "name": "d", "claims": [{"name": "kv", "memory": "1GiB"}, {"name": "own", "gpus": 1}],
        "components": [{"name": "p", "command": ["x"], "sharing": [{"claim": "own", "scope": "all-replicas"}]},
                       {"name": "s", "shadow_of": "p", "command": ["x"]}, {"name": "q", "command": ["x"]}],
        "scaling_groups": [{"name": "g", "components": ["p", "s", "q"], "sharing": [
            {"claim": "kv", "scope": "per-replica", "filter": {"components": ["p"]}}]}]}),
}


def rendered(name: str, sharing: str) -> Doc:
    spec: DeploymentSpec = SPECS[name]()
    documents = render_deployment(spec, namespace="ml", image=IMAGE, sharing=sharing).documents
    assert len(documents) == 1
    return documents[0]


@pytest.mark.parametrize("sharing", ["dra", "mps"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_the_podcliqueset_is_valid_for_the_grove_release(name: str, sharing: str) -> None:
    assert grove_errors(rendered(name, sharing)) == []


@pytest.mark.parametrize("sharing", ["dra", "mps"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_its_claims_and_pods_are_valid_kubernetes_1_37(name: str, sharing: str) -> None:
    objects = kubernetes_objects(rendered(name, sharing))
    assert {o["kind"] for o in objects} == {"ResourceClaimTemplate", "Pod"}
    for obj in objects:
        strict_kubernetes(obj)


def _claim_template(sharing: str) -> Doc:
    return next(o for o in kubernetes_objects(rendered("every-kind", sharing))
                if o["kind"] == "ResourceClaimTemplate" and o["metadata"]["name"] == "share")


@pytest.mark.parametrize(("sharing", "where", "wrong"), [
    ("dra", ("spec", "spec", "devices", "requests", 0, "exactly"), "deviceClass"),
    ("dra", ("spec", "spec", "devices", "requests", 0, "exactly", "capacity"), "request"),
    ("dra", ("spec", "spec", "devices", "constraints", 0), "distinctAttributes"),
    ("mps", ("spec", "spec", "devices", "config", 0), "opaqueConfig"),
])
def test_kubernetes_1_37_refuses_a_wrong_field_name_in_a_claim_template(
        sharing: str, where: tuple[Any, ...], wrong: str) -> None:
    good = _claim_template(sharing)
    strict_kubernetes(good)
    bad = copy.deepcopy(good)
    node = bad
    for key in where:
        node = node[key]
    node[wrong] = "x"
    with pytest.raises(kubernetes_validate.ValidationError, match=f"'{wrong}' was unexpected"):
        strict_kubernetes(bad)


def test_kubernetes_1_37_refuses_a_wrong_field_name_in_a_pod() -> None:
    pod = next(o for o in kubernetes_objects(rendered("every-kind", "dra")) if o["kind"] == "Pod")
    pod["spec"]["containers"][0]["workDir"] = "/work"
    with pytest.raises(kubernetes_validate.ValidationError, match="'workDir' was unexpected"):
        strict_kubernetes(pod)


@pytest.mark.parametrize(("where", "wrong"), [
    ((), "resourceShare"),
    (("cliques", 0), "sharing"),
    (("cliques", 0, "spec"), "replica"),
    (("cliques", 0, "spec", "podSpec", "containers", 0), "imageName"),
    (("resourceSharing", 2, "filter"), "childCliques"),
    (("podCliqueScalingGroups", 0), "cliques"),
    (("resourceClaimTemplates", 0, "templateSpec", "spec", "devices", "requests", 0, "exactly"), "cont"),
])
def test_the_grove_schema_refuses_a_wrong_field_name(where: tuple[Any, ...], wrong: str) -> None:
    pcs = rendered("grove-sharing", "dra")
    node = pcs["spec"]["template"]
    for key in where:
        node = node[key]
    node[wrong] = "x"
    errors = grove_errors(pcs)
    assert len(errors) == 1 and f"'{wrong}' was unexpected" in errors[0], errors


def test_the_grove_schema_refuses_a_scope_grove_does_not_know() -> None:
    pcs = rendered("grove-sharing", "dra")
    pcs["spec"]["template"]["resourceSharing"][0]["scope"] = "all-replicas"
    assert grove_errors(pcs) != []


def test_the_schema_names_the_grove_release_it_was_made_from() -> None:
    comment = json.loads(SCHEMA.read_text())["$comment"]
    assert "ai-dynamo/grove v0.1.0-alpha.11" in comment and "8fa3ece93434d7c0005605b7dc4b0e23610af88b" in comment
