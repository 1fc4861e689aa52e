"""What holds for every deployment file, rendered: Grove accepts it, and no pod loses a claim.

Random valid files (claims of every kind, components with a shadow,
scaling groups, sharing at every level with every scope and filter):
the PodCliqueSet passes the Grove release's schema; every clique gets at
least the claims its component gets on one box, and more only where a
warning names the set-level filter that could not be kept; every warning
names a field of the file.
"""

from __future__ import annotations

import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from computegroups.daemon.kubernetes.render import render_deployment
from computegroups.daemon.model.deployment import DeploymentError, DeploymentSpec, parse
from tests.kubernetes.render_samples import IMAGE
from tests.kubernetes.test_render_schemas import grove_errors

CLAIM_KINDS = [{"gpus": 2}, {"mig": "1g.10gb"}, {"memory": "1GiB"}, {"memory": "512MiB", "compute": 20},
               {"compute": 10, "distinct": True}]
SCOPES = ["all-replicas", "per-replica"]
FIELD = re.compile(r"^(replicas|(claims|components|sharing|scaling_groups)\[\d+\][.:\w\[\] ]*?)[: ]")


@st.composite
def deployment_files(draw: st.DrawFn) -> dict[str, Any]:
    claims = [f"c{i}" for i in range(draw(st.integers(1, 4)))]
    workers = [f"w{i}" for i in range(draw(st.integers(1, 4)))]
    in_group = draw(st.lists(st.sampled_from(workers), unique=True, max_size=len(workers)))
    shadow = draw(st.booleans())

    def entries(targets: list[str] | None, with_groups: bool) -> list[dict[str, Any]]:
        out = []
        for claim in draw(st.lists(st.sampled_from(claims), unique=True, max_size=3)):
            entry: dict[str, Any] = {"claim": claim, "scope": draw(st.sampled_from(SCOPES))}
            flt: dict[str, Any] = {}
            if targets and draw(st.booleans()):
                flt["components"] = draw(st.lists(st.sampled_from(targets), unique=True, min_size=1))
            if with_groups and in_group and draw(st.booleans()):
                flt["scaling_groups"] = ["g"]
            if flt:
                entry["filter"] = flt
            out.append(entry)
        return out

    components: list[dict[str, Any]] = [
        {"name": w, "command": ["run"], "replicas": draw(st.integers(1, 3)), "sharing": entries(None, False)}
        for w in workers]
    group_members = list(in_group)
    if shadow:
        components.append({"name": "standby", "shadow_of": "w0", "command": ["wait"]})
        if "w0" in in_group:
            group_members.append("standby")
    file: dict[str, Any] = {
        "name": "d", "replicas": draw(st.integers(1, 2)),
        "claims": [{"name": c, **draw(st.sampled_from(CLAIM_KINDS))} for c in claims],
        "components": components, "sharing": entries(workers, True)}
    if in_group:
        file["scaling_groups"] = [{"name": "g", "components": group_members, "replicas": draw(st.integers(1, 3)),
                                   "sharing": entries(in_group, False)}]
    return file


def local_reach(spec: DeploymentSpec, component: str) -> set[str]:
    """The claims a component's replicas get on one box (docs/deployments.md); a shadow, its primary's."""
    c = spec.component(component)
    name = c.shadow_of or c.name
    group = spec.group_of(name)
    found = {e.claim for e in spec.component(name).sharing}
    found |= {e.claim for e in spec.sharing if not e.filtered or name in (e.components or ())
              or (group is not None and group in (e.scaling_groups or ()))}
    for g in spec.scaling_groups:
        if g.name == group:
            found |= {e.claim for e in g.sharing if not e.filtered or name in (e.components or ())}
    return found


def rendered_reach(template: dict[str, Any], clique: str) -> set[str]:
    """The claims Grove gives a clique's pods, read from the rendered set (GREP-390's rules)."""
    group = next((g["name"] for g in template.get("podCliqueScalingGroups", []) if clique in g["cliqueNames"]),
                 None)

    def reached(entry: dict[str, Any], top: bool) -> bool:
        flt = entry.get("filter")
        return (flt is None or clique in flt.get("childCliqueNames", ())
                or (top and group is not None and group in flt.get("childScalingGroupNames", ())))

    found = {e["name"] for e in template.get("resourceSharing", []) if reached(e, top=True)}
    for g in template.get("podCliqueScalingGroups", []):
        if g["name"] == group:
            found |= {e["name"] for e in g.get("resourceSharing", []) if reached(e, top=False)}
    clique_doc = next(c for c in template["cliques"] if c["name"] == clique)
    return found | {e["name"] for e in clique_doc.get("resourceSharing", [])}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deployment_files(), st.sampled_from(["dra", "mps"]))
def test_every_file_renders_a_set_grove_accepts_and_no_pod_loses_a_claim(file: dict[str, Any],
                                                                         sharing: str) -> None:
    try:
        spec = parse(file)
    except DeploymentError:
        return  # a file the model refuses is not rendered (cgctl says why, as `cgctl apply` does)
    rendered = render_deployment(spec, namespace="ml", image=IMAGE, sharing=sharing)
    pcs = rendered.documents[0]
    assert grove_errors(pcs) == []
    template = pcs["spec"]["template"]
    widened = any(w.startswith("sharing[") and ".filter.components[" in w for w in rendered.warnings)
    for c in spec.components:
        mine, theirs = local_reach(spec, c.name), rendered_reach(template, c.name)
        assert mine <= theirs, (c.name, mine, theirs)
        assert mine == theirs or widened, (c.name, mine, theirs)
    for warning in rendered.warnings:
        assert FIELD.match(warning), warning
