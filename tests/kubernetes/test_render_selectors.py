"""Issue 17's device selectors and sharing modes in DRA (render_selectors.py, render_claims.py)."""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from computegroups.daemon.kubernetes.render import render_deployment
from computegroups.daemon.kubernetes.render_claims import claim_template_spec
from computegroups.daemon.kubernetes.render_selectors import cel_string, glob_regex, model_regex
from computegroups.daemon.model.claims import Claim
from computegroups.daemon.model.deployment import parse
from computegroups.topology.names import model_matches
from tests.kubernetes.render_samples import IMAGE, SELECTORS

ATTRS = "device.attributes['gpu.nvidia.com']"


def spec_of(claim: dict[str, Any], sharing: str = "dra") -> dict[str, Any]:
    devices: dict[str, Any] = claim_template_spec(Claim.from_dict(claim), sharing)["devices"]
    return devices


def expressions(request: dict[str, Any]) -> list[str]:
    return [s["cel"]["expression"] for s in request.get("selectors", [])]


GLOB_TEXT = st.text(alphabet="aAh1 0-*?[]!^.\\()+|$&~", max_size=8)


@pytest.mark.filterwarnings("ignore:Possible:FutureWarning")  # Python's re on `[[]`, `[--]`; RE2 reads them plainly
@given(glob=GLOB_TEXT, name=st.text(alphabet="aAh1 0-.\\()+|$[]!^", max_size=8))
def test_a_model_glob_becomes_a_regex_that_matches_the_names_the_glob_matches(glob: str, name: str) -> None:
    assert bool(re.fullmatch(glob_regex(glob), name)) == fnmatchcase(name, glob)


@pytest.mark.filterwarnings("ignore:Possible:FutureWarning")
@given(glob=GLOB_TEXT,
       name=st.sampled_from(["NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090"])
       | st.text(alphabet="aAh1 0-.\\()+|$[]!^", max_size=8))
def test_the_cel_model_regex_matches_the_names_cgd_matches(glob: str, name: str) -> None:
    assert bool(re.fullmatch(model_regex(glob), name.lower())) == model_matches(name, glob)
    assert re.fullmatch(model_regex("H100*"), "nvidia h100 80gb hbm3"), "the vendor words are optional in both"


def test_the_regex_escapes_only_what_re2_allows_escaped() -> None:
    assert glob_regex("NVIDIA A100-SXM4?80GB*") == "^NVIDIA A100-SXM4.80GB.*$"
    assert glob_regex("a.b[!0-9]") == "^a\\.b[^0-9]$"
    assert cel_string("it's \\.") == "'it\\'s \\\\.'"


def test_selectors_are_cel_on_the_attributes_and_capacity_nvidias_driver_publishes() -> None:
    (request,) = spec_of({"gpus": 2, "model": "*H100*", "min_memory_mib": "80GiB",
                          "compute_capability": "8.9"})["requests"]
    assert request["exactly"]["count"] == 2
    assert expressions(request["exactly"]) == [
        f"{ATTRS}.productName.lowerAscii().matches('^(?:(?:nvidia|tesla|geforce|quadro)[\\\\s-]+)*.*h100.*$')",
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('80Gi')) >= 0",
        f"{ATTRS}.cudaComputeCapability.compareTo(semver('8.9.0')) >= 0",
    ]


def test_same_model_is_a_match_attribute_on_the_product_name() -> None:
    assert spec_of({"gpus": 4, "same": "model"})["constraints"] == [{"matchAttribute": "gpu.nvidia.com/productName"}]
    assert "constraints" not in spec_of({"gpus": 4})


def test_share_modes_are_a_capacity_request_a_whole_device_or_dras_prioritized_list() -> None:
    (share,) = spec_of({"memory_mib": 20480, "share": "share"})["requests"]
    assert share["exactly"] == {"deviceClassName": "gpu.nvidia.com", "capacity": {"requests": {"memory": "20Gi"}}}
    (whole,) = spec_of({"memory_mib": 20480, "min_memory_mib": 40960, "share": "whole"})["requests"]
    assert whole["name"] == "gpus" and "capacity" not in whole["exactly"] and whole["exactly"]["count"] == 1
    assert expressions(whole["exactly"]) == [
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0"]
    (either,) = spec_of({"memory_mib": 20480, "share": "any"})["requests"]
    first, then = either["firstAvailable"]
    assert (first["name"], first["capacity"]) == ("share", {"requests": {"memory": "20Gi"}})
    assert (then["name"], then["count"]) == ("whole", 1)
    assert expressions(then) == ["device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('20Gi')) >= 0"]
    mps = spec_of({"memory_mib": 20480, "share": "any"}, "mps")
    assert mps["config"][0]["requests"] == ["share/share"], "MPS configures the share, not the whole device"


def test_cpu_bind_and_a_mig_devices_memory_floor_are_warnings_naming_the_field() -> None:
    rendered = render_deployment(parse(SELECTORS), namespace="ml", image=IMAGE)
    fields = sorted(w.split(":")[0] for w in rendered.warnings if "not rendered" in w or "no DRA form" in w)
    assert fields == ["claims[4].min_memory_mib", "components[0].cpu_bind"]
    template = rendered.documents[0]["spec"]["template"]
    assert "cores" not in [t["name"] for t in template["resourceClaimTemplates"]]
    shared = [e["name"] for c in template["cliques"] for e in c.get("resourceSharing", [])]
    shared += [e["name"] for e in template.get("resourceSharing", [])]
    assert "cores" not in shared and "fast" in shared, "a CPU-only claim is shared by nobody on the cluster"


def test_cpus_are_the_containers_cpu_request() -> None:
    rendered = render_deployment(parse(SELECTORS), namespace="ml", image=IMAGE)
    pods = {c["name"]: c["spec"]["podSpec"] for c in rendered.documents[0]["spec"]["template"]["cliques"]}
    (train,) = pods["train"]["containers"]
    (prep,) = pods["prep"]["containers"]
    assert train["resources"] == {"requests": {"cpu": "24"}}, "fast's 16 and cores' 8, the claims it uses"
    assert prep["resources"] == {"requests": {"cpu": "8"}}, "a request, no limit: cgd counts CPUs, never caps them"
    (shared,) = [w for w in rendered.warnings if w.startswith("claims[5].cpus:")]
    assert "shared by all replicas" in shared and "each pod" in shared
    assert not [w for w in rendered.warnings if w.startswith("claims[0].cpus")], "a per-replica claim's CPUs map"
    plain = render_deployment(parse({"name": "p", "claims": [{"name": "g", "gpus": 1}], "components": [
        {"name": "w", "command": ["x"], "sharing": [{"claim": "g", "scope": "per-replica"}]}]}),
        namespace="ml", image=IMAGE)
    (w,) = plain.documents[0]["spec"]["template"]["cliques"][0]["spec"]["podSpec"]["containers"]
    assert "resources" not in w, "no cpus claimed: no CPU request"
