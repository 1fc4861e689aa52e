"""The mapping of daemon/kubernetes/render*.py, field by field (docs/kubernetes.md)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest

from computegroups.daemon.kubernetes.render import Rendered, RenderError, render_deployment
from computegroups.daemon.kubernetes.render_pods import pod_spec
from computegroups.daemon.model.deployment import parse
from computegroups.daemon.model.requests import ComponentRequest, RestartSpec
from tests.kubernetes.render_samples import EVERY_KIND, IMAGE, ROOT, example, spec


def render(s: Any, sharing: str = "dra") -> Rendered:
    return render_deployment(s, namespace="ml", image=IMAGE, sharing=sharing)


def template(rendered: Rendered) -> dict[str, Any]:
    out: dict[str, Any] = rendered.documents[0]["spec"]["template"]
    return out


def cliques(rendered: Rendered) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in template(rendered)["cliques"]}


def claim_spec(rendered: Rendered, name: str) -> dict[str, Any]:
    out: dict[str, Any] = next(t["templateSpec"]["spec"] for t in template(rendered)["resourceClaimTemplates"]
                               if t["name"] == name)
    return out


def warned(rendered: Rendered, field: str) -> list[str]:
    return [w for w in rendered.warnings if w.startswith(f"{field}:") or w.startswith(f"{field} ")]


def test_the_example_keeps_every_level_scope_and_filter_of_the_file() -> None:
    r = render(example())
    pcs = r.documents[0]
    assert len(r.documents) == 1
    assert (pcs["apiVersion"], pcs["kind"]) == ("grove.io/v1alpha1", "PodCliqueSet")
    assert pcs["metadata"] == {"name": "rs", "namespace": "ml",
                               "labels": {"app.kubernetes.io/managed-by": "computegroups"}}
    assert pcs["spec"]["replicas"] == 1
    t = template(r)
    assert [c["name"] for c in t["cliques"]] == ["worker-a", "worker-a-standby", "worker-b", "worker-c"]
    assert t["podCliqueScalingGroups"] == [{
        "name": "sga", "replicas": 2, "cliqueNames": ["worker-b", "worker-c"],
        "resourceSharing": [
            {"name": "kv", "scope": "AllReplicas"},
            {"name": "rank", "scope": "PerReplica"},
            {"name": "b-cache", "scope": "AllReplicas", "filter": {"childCliqueNames": ["worker-b"]}},
        ]}]
    pair = ["worker-a", "worker-a-standby"]
    assert t["resourceSharing"] == [
        {"name": "set-pool", "scope": "AllReplicas"},
        {"name": "set-slot", "scope": "PerReplica"},
        {"name": "a-slot", "scope": "PerReplica", "filter": {"childCliqueNames": pair}},
        {"name": "sga-pool", "scope": "AllReplicas", "filter": {"childScalingGroupNames": ["sga"]}},
        # worker-a's all-replicas claim, one level up so that its shadow shares it
        {"name": "a-common", "scope": "PerReplica", "filter": {"childCliqueNames": pair}},
    ]
    by_name = cliques(r)
    assert by_name["worker-b"]["resourceSharing"] == [{"name": "b-common", "scope": "AllReplicas"}]
    assert "resourceSharing" not in by_name["worker-c"]
    assert [t["name"] for t in t["resourceClaimTemplates"]] == [c.name for c in example().claims]


def test_a_shadow_is_a_clique_on_its_primarys_claims_and_says_promotion_is_not_automatic() -> None:
    r = render(example())
    standby = cliques(r)["worker-a-standby"]
    assert standby["annotations"]["computegroups.io/shadow-of"] == "worker-a"
    assert "promotion is not automatic" in standby["annotations"]["computegroups.io/note"]
    assert standby["spec"]["replicas"] == cliques(r)["worker-a"]["spec"]["replicas"]
    # a per-replica claim of the primary cannot pair with the shadow in Grove: said, not hidden
    assert standby["resourceSharing"] == [{"name": "a-rank", "scope": "PerReplica"}]
    [shadow] = warned(r, "components[1].shadow_of")
    assert "promotion is not automatic on Kubernetes" in shadow
    [rank] = warned(r, "components[0].sharing[0]")
    assert "'a-rank'" in rank and "claims of its own" in rank


def test_a_shadow_in_a_scaling_group_joins_the_group_and_its_filters() -> None:
    s = parse({"name": "d", "claims": [{"name": "kv", "memory": "1GiB"}, {"name": "own", "gpus": 1}],
               "components": [{"name": "p", "command": ["x"], "sharing": [{"claim": "own", "scope": "all-replicas"}]},
                              {"name": "s", "shadow_of": "p", "command": ["x"]}, {"name": "q", "command": ["x"]}],
               "scaling_groups": [{"name": "g", "components": ["p", "s", "q"], "sharing": [
                   {"claim": "kv", "scope": "per-replica", "filter": {"components": ["p"]}}]}]})
    r = render(s)
    [group] = template(r)["podCliqueScalingGroups"]
    assert group["cliqueNames"] == ["p", "s", "q"]
    assert group["resourceSharing"] == [
        {"name": "kv", "scope": "PerReplica", "filter": {"childCliqueNames": ["p", "s"]}},
        {"name": "own", "scope": "PerReplica", "filter": {"childCliqueNames": ["p", "s"]}},
    ]
    assert "resourceSharing" not in cliques(r)["p"]
    assert not warned(r, "components[0].sharing[0]")


def test_whole_gpus_mig_and_shares_as_dra_requests() -> None:
    r = render(parse(EVERY_KIND))
    assert claim_spec(r, "whole") == {"devices": {
        "requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}}],
        "constraints": [{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]}}
    assert claim_spec(r, "slice") == {"devices": {
        "requests": [{"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com", "selectors": [
            {"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}}]}}],
        "constraints": [{"distinctAttribute": "gpu.nvidia.com/parentUUID"}]}}
    assert claim_spec(r, "share") == {"devices": {
        "requests": [{"name": "share", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                   "capacity": {"requests": {"memory": "1536Mi", "compute": "30"}}}}],
        "constraints": [{"distinctAttribute": "gpu.nvidia.com/uuid"}]}}
    [capacity] = warned(r, "claims[2]")[-1:]
    assert "consumable capacity" in capacity and "--sharing mps" in capacity


def test_mps_renders_nvidias_gpu_config_with_the_shares_limits() -> None:
    r = render(parse(EVERY_KIND), sharing="mps")
    share = claim_spec(r, "share")["devices"]
    assert share["requests"] == [{"name": "share", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
    assert share["config"] == [{"requests": ["share"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 30,
                                                     "defaultPinnedDeviceMemoryLimit": "1536Mi"}}}}}]
    assert claim_spec(r, "whole") == claim_spec(render(parse(EVERY_KIND)), "whole")
    assert not [w for w in r.warnings if "consumable capacity" in w]


def test_what_has_no_kubernetes_form_is_a_warning_naming_the_field() -> None:
    r = render(parse(EVERY_KIND))
    for field in ("gpu_ids", "pool", "strategy", "priority", "allow_busy", "colocate", "exclusive", "affinity[0]"):
        assert warned(r, f"claims[3].{field}"), (field, r.warnings)
    assert warned(r, "claims[2].distinct")  # per-replica claims are each separate on a cluster
    assert warned(r, "components[0].restart.max_retries")
    assert warned(r, "components[0].restart.backoff_s")
    assert warned(r, "components[2].command")
    assert not warned(r, "claims[0].colocate")  # pcie maps; machine-level anti-affinity maps
    assert not warned(r, "claims[0].anti_affinity[0]")


def test_a_file_with_nothing_unmappable_renders_without_warnings() -> None:
    r = render(spec([{"name": "g", "gpus": 4}, {"name": "m", "mig": "3g.40gb"}]))
    assert r.warnings == []


def test_machine_level_affinity_is_pod_affinity_on_the_hostname_for_the_claims_users_only() -> None:
    r = render(parse(EVERY_KIND))
    by_name = cliques(r)
    trainer = by_name["trainer"]["spec"]["podSpec"]
    assert trainer["affinity"] == {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"computegroups.io/component": "db"}},
         "topologyKey": "kubernetes.io/hostname"}]}}
    assert by_name["eval"]["spec"]["podSpec"]["affinity"] == {"podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"computegroups.io/component": "cache"}},
             "topologyKey": "kubernetes.io/hostname"}]}}
    assert "affinity" not in by_name["holder"]["spec"]["podSpec"]
    assert by_name["eval"]["labels"] == {"computegroups.io/component": "eval"}


def test_process_rules_map_to_the_pod() -> None:
    by_name = cliques(render(parse(EVERY_KIND)))
    trainer = by_name["trainer"]["spec"]
    assert trainer["replicas"] == 2
    assert trainer["podSpec"] == {
        "restartPolicy": "OnFailure", "terminationGracePeriodSeconds": 3,
        "affinity": trainer["podSpec"]["affinity"],
        "containers": [{"name": "trainer", "image": IMAGE, "command": ["python", "train.py"],
                        "env": [{"name": "EPOCHS", "value": "3"}], "workingDir": "/work"}]}
    assert by_name["eval"]["spec"]["podSpec"]["restartPolicy"] == "Never"
    assert by_name["holder"]["spec"]["podSpec"]["restartPolicy"] == "Always"  # a deployment runs services
    assert "command" not in by_name["holder"]["spec"]["podSpec"]["containers"][0]


def test_a_time_limit_is_the_pods_active_deadline() -> None:
    request = ComponentRequest(name="job", command=("sh", "-c", "train"), time_limit_s=90.5,
                               restart=RestartSpec(policy="never"))  # type: ignore[arg-type]
    spec_ = pod_spec(request, "job", IMAGE, {})
    assert spec_["activeDeadlineSeconds"] == 91
    assert spec_["restartPolicy"] == "Never"
    shell = pod_spec(ComponentRequest(name="s", command=("echo hi | wc",), shell=True), "s", IMAGE, {})
    assert shell["containers"][0]["command"] == ["/bin/sh", "-c", "echo hi | wc"]
    assert "activeDeadlineSeconds" not in shell


def test_a_set_filter_on_a_component_inside_a_scaling_group_reaches_its_group_and_says_so() -> None:
    s = parse({"name": "d", "claims": [{"name": "c", "memory": "1GiB"}],
               "components": [{"name": "a", "command": ["x"]}, {"name": "b", "command": ["x"]}],
               "scaling_groups": [{"name": "g", "components": ["a", "b"]}],
               "sharing": [{"claim": "c", "scope": "per-replica", "filter": {"components": ["a"]}}]})
    r = render(s)
    assert template(r)["resourceSharing"] == [
        {"name": "c", "scope": "PerReplica", "filter": {"childScalingGroupNames": ["g"]}}]
    [w] = warned(r, "sharing[0].filter.components[0]")
    assert "'g'" in w


def test_scaled_counts_are_said_not_to_be_rendered() -> None:
    s = example().scaled("sga", 5)
    r = render(s)
    assert template(r)["podCliqueScalingGroups"][0]["replicas"] == 2
    assert warned(r, "replicas")


def test_a_components_own_image_and_time_limit_come_from_the_file() -> None:
    s = parse({"name": "d", "components": [
        {"name": "a", "command": ["x"], "image": "example/a:1", "time_limit_s": 3600.5},
        {"name": "b", "command": ["x"]}]})
    by_name = cliques(render_deployment(s, namespace="ml", image=IMAGE))
    a, b = by_name["a"]["spec"]["podSpec"], by_name["b"]["spec"]["podSpec"]
    assert (a["containers"][0]["image"], a["activeDeadlineSeconds"]) == ("example/a:1", 3601)
    assert b["containers"][0]["image"] == IMAGE and "activeDeadlineSeconds" not in b
    alone = cliques(render_deployment(parse({"name": "d", "components": [
        {"name": "a", "command": ["x"], "image": "example/a:1"}]}), namespace="ml", image=None))
    assert alone["a"]["spec"]["podSpec"]["containers"][0]["image"] == "example/a:1", "no --image needed"
    with pytest.raises(RenderError, match=r"^components\[1\]\.image: 'b' names no image and none was given"):
        render_deployment(s, namespace="ml", image=None)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"image": None}, "components[0].image"),
    ({"image": ""}, "components[0].image"),
    ({"sharing": "hami"}, "sharing"),
    ({"namespace": "Bad_NS"}, "namespace"),
])
def test_what_cannot_be_rendered_is_refused_in_one_line(kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"namespace": "ml", "image": IMAGE, "sharing": "dra", **kwargs}
    with pytest.raises(RenderError) as caught:
        render_deployment(example(), **args)
    assert str(caught.value).startswith(f"{field}: ")
    assert "\n" not in str(caught.value)


def test_rendering_loads_neither_lightkube_nor_yaml() -> None:
    """The local path, and rendering itself, never load the Kubernetes client or a YAML library."""
    code = textwrap.dedent("""
        import sys
        import computegroups.daemon.kubernetes.render
        import computegroups.cli.kubernetes_render
        import computegroups.cli.main
        import computegroups.daemon.main
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("lightkube", "yaml", "kubernetes")))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_warnings_name_an_included_claim_by_its_own_file_and_index() -> None:
    s = parse({"name": "inc", "include": ["claims/gpu.toml"],
               "claims": [{"name": "one", "gpus": 1}, {"name": "two", "gpus": 1, "strategy": "spread"}],
               "components": [{"name": "w", "command": ["x"], "sharing": [{"claim": "two", "scope": "per-replica"}]}]},
              "sel.toml", {"claims/gpu.toml": {"claims": [{"name": "kv", "memory": "2GiB"},
                                                          {"name": "big", "gpus": 1, "pool": "a"}]}})
    r = render(s)
    assert warned(r, "claims[1].strategy"), r.warnings
    assert warned(r, "claims/gpu.toml: claims[1].pool"), r.warnings
    assert warned(r, "claims/gpu.toml: claims[0]"), "the share's capacity warning names the included claim"
    assert not [w for w in r.warnings if w.startswith(("claims[2]", "claims[3]"))], r.warnings
