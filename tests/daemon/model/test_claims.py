"""Claims: what is accepted, what is refused and how the refusal reads."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from computegroups.daemon.model.claims import (
    AffinityTerm,
    AllocatorConfig,
    Claim,
    ClaimError,
    Level,
    Strategy,
    parse_size,
)
from computegroups.topology.model import DomainKind


def refusal(d: object, path: str = "claim") -> str:
    with pytest.raises(ClaimError) as info:
        Claim.from_dict(d, path)  # type: ignore[arg-type]
    return str(info.value)


def test_full_claim_round_trips() -> None:
    d = {
        "gpus": 4, "strategy": "spread", "colocate": "nvlink", "exclusive": "numa", "pool": "fast",
        "gpu_ids": [0, 1, 2, 3, 4], "priority": -3, "allow_busy": True, "distinct": True,
        "affinity": [{"component": "db", "level": "numa"}],
        "anti_affinity": [{"component": "web", "level": "device"}],
    }
    claim = Claim.from_dict(d)
    assert claim.kind == "whole"
    assert claim.colocate is DomainKind.NVLINK and claim.exclusive is DomainKind.NUMA
    assert claim.strategy is Strategy.SPREAD
    assert claim.affinity == (AffinityTerm("db", Level.NUMA),)
    assert claim.to_dict() == d
    assert Claim.from_dict(claim.to_dict()) == claim


def test_defaults_are_left_out_of_the_canonical_form() -> None:
    assert Claim.from_dict({"gpus": 1, "colocate": "none"}).to_dict() == {"gpus": 1}
    # An explicit strategy is kept: it overrides the daemon's configured default.
    assert Claim.from_dict({"gpus": 1, "strategy": "binpack"}).to_dict() == {"gpus": 1, "strategy": "binpack"}


@pytest.mark.parametrize("d, kind", [
    ({"gpus": 2}, "whole"),
    ({"memory_mib": 1024}, "share"),
    ({"compute_pct": 30}, "share"),
    ({"memory_mib": 1024, "compute_pct": 30}, "share"),
    ({"mig": "1g.10gb"}, "mig"),
])
def test_kind(d: dict, kind: str) -> None:
    assert Claim.from_dict(d).kind == kind


def test_memory_accepts_sizes_and_keeps_mib() -> None:
    claim = Claim.from_dict({"memory_mib": "1.5GiB"})
    assert claim.memory_mib == 1536
    assert claim.to_dict() == {"memory_mib": 1536}


def test_gpu_ids_are_sorted() -> None:
    assert Claim.from_dict({"gpus": 2, "gpu_ids": [3, 1]}).gpu_ids == (1, 3)


@pytest.mark.parametrize("d, message", [
    ({"compute_pct": 150}, "claim.compute_pct: must be between 1 and 100, got 150"),
    ({"compute_pct": 0}, "claim.compute_pct: must be between 1 and 100, got 0"),
    ({"gpus": 0}, "claim.gpus: must be between 1 and 1024, got 0"),
    ({"gpus": True}, "claim.gpus: expected an integer, got True"),
    ({"gpus": 1.0}, "claim.gpus: expected an integer, got 1.0"),
    ({"memory_mib": 0}, "claim.memory_mib: must be at least 1, got 0"),
    ({"memory_mib": "lots"}, "claim.memory_mib: not a size"),
    ({"gpus": 1, "priority": "high"}, "claim.priority: expected an integer"),
    ({"gpus": 1, "priority": False}, "claim.priority: expected an integer"),
    ({"gpus": 1, "distinct": 1}, "claim.distinct: expected true or false"),
    ({"gpus": 1, "allow_busy": "yes"}, "claim.allow_busy: expected true or false"),
    ({"gpus": 1, "strategy": "random"}, "claim.strategy: must be one of binpack, spread"),
    ({"gpus": 1, "colocate": "rack"}, "claim.colocate: must be one of nvlink, pcie, numa, machine, none"),
    ({"gpus": 1, "exclusive": "machine"}, "claim.exclusive: must be one of nvlink, pcie, numa, none"),
    ({"gpus": 1, "gpu_ids": [0, 0]}, "claim.gpu_ids: a GPU is listed twice"),
    ({"gpus": 1, "gpu_ids": []}, "claim.gpu_ids: may not be empty"),
    ({"gpus": 1, "gpu_ids": [0, -1]}, "claim.gpu_ids[1]: must be at least 0, got -1"),
    ({"gpus": 1, "gpu_ids": "0,1"}, "claim.gpu_ids: expected a list"),
    ({"gpus": 3, "gpu_ids": [0, 1]}, "claim.gpu_ids: pins 2 GPUs but the claim asks for 3"),
    ({"gpus": 2, "gpu_ids": [3]}, "claim.gpu_ids: pins 1 GPU but the claim asks for 2"),
    ({"cpus": 0}, "claim.cpus: must be between 1 and 65536, got 0"),
    ({"gpus": 1, "cpus": 0}, "claim.cpus: must be between 1 and 65536, got 0"),
    ({"gpus": 1, "pool": ""}, "claim.pool: may not be empty"),
    ({"mig": ""}, "claim.mig: expected a MIG profile name"),
    ({"gpus": 1, "affinity": "db"}, "claim.affinity: expected a list"),
    ({"gpus": 1, "affinity": [{"level": "numa"}]}, "claim.affinity[0].component: required"),
    ({"gpus": 1, "affinity": [{"component": "db", "lvl": "numa"}]}, "claim.affinity[0].lvl: unknown field"),
    ({"gpus": 1, "anti_affinity": [{"component": "db", "level": "rack"}]},
     "claim.anti_affinity[0].level: must be one of device, nvlink, pcie, numa, machine"),
    ({"gpus": 1, "affinity": [{"component": "Bad Name"}]},
     "claim.affinity[0].component: 'Bad Name' is not a valid name"),
    ({"gpus": 1, "replicas": 2}, "claim.replicas: unknown field"),
    ({}, "claim: nothing claimed"),
    ({"gpus": 1, "memory_mib": 10}, "claim: gpus and memory_mib/compute_pct do not combine"),
    ({"mig": "1g.10gb", "compute_pct": 10}, "claim: memory_mib/compute_pct and mig do not combine"),
    ([1], "claim: expected an object"),
])
def test_refusals_name_the_field(d: object, message: str) -> None:
    assert refusal(d).startswith(message)


def test_refusal_uses_the_callers_path() -> None:
    assert refusal({"compute_pct": 150}, "components.web.claim") == (
        "components.web.claim.compute_pct: must be between 1 and 100, got 150")
    assert refusal({}, "deploy.claim").startswith("deploy.claim: nothing claimed")


def test_direct_construction_is_checked_too() -> None:
    # Code that builds a claim gets a plain ValueError (`field: problem`); the
    # decoders put it under the path of the value it came from.
    with pytest.raises(ValueError, match=r"^exclusive: must be one of nvlink, pcie, numa, none"):
        Claim(gpus=1, exclusive=DomainKind.MACHINE)
    with pytest.raises(ValueError, match=r"^colocate: must be one of"):
        Claim(gpus=1, colocate="rack")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^cpus: must be at least 1, got 0"):
        Claim(cpus=0)
    assert Claim(gpus=1, colocate="nvlink").colocate is DomainKind.NVLINK  # type: ignore[arg-type]


@pytest.mark.parametrize("text, mib", [
    ("20GiB", 20480), ("512MiB", 512), ("20G", 20480), ("20GB", 20480), ("1.5GiB", 1536),
    ("20000", 20000), (" 2 tib ", 2 * 1024 * 1024), ("512k", 1), ("0.1GiB", 103), (64, 64),
])
def test_parse_size(text: str | int, mib: int) -> None:
    assert parse_size(text) == mib


@pytest.mark.parametrize("text", ["", "GiB", "20 GiBs", "-1GiB", "0", "1e3", "20 PB", "1.2.3G", True, None, 2.5])
def test_parse_size_refuses_garbage(text: object) -> None:
    with pytest.raises(ValueError):
        parse_size(text)  # type: ignore[arg-type]


def test_default_share() -> None:
    assert AllocatorConfig().share_mib(49140) == 12285
    assert AllocatorConfig(default_share_fraction=0.5).share_mib(1000) == 500
    assert AllocatorConfig(default_share_mib=4096).share_mib(49140) == 4096
    with pytest.raises(ValueError):
        AllocatorConfig(default_share_fraction=0)


_names = st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True)
_terms = st.lists(st.builds(AffinityTerm, _names, st.sampled_from(["device", "nvlink", "pcie", "numa", "machine"])),
                  max_size=2).map(tuple)
_placement = {
    "distinct": st.booleans(), "strategy": st.sampled_from(list(Strategy)),
    "colocate": st.none() | st.sampled_from(list(DomainKind)),
    "exclusive": st.none() | st.sampled_from([DomainKind.NVLINK, DomainKind.PCIE, DomainKind.NUMA]),
    "pool": st.none() | _names, "priority": st.integers(-5, 5), "allow_busy": st.booleans(),
    "affinity": _terms, "anti_affinity": _terms,
}
claims = st.one_of(
    st.builds(Claim, gpus=st.integers(1, 8), **_placement),
    st.builds(Claim, memory_mib=st.integers(1, 10**6), compute_pct=st.none() | st.integers(1, 100), **_placement),
    st.builds(Claim, compute_pct=st.integers(1, 100), **_placement),
    st.builds(Claim, mig=st.sampled_from(["1g.10gb", "3g.40gb"]), **_placement),
)


@settings(max_examples=150, derandomize=True)
@given(claims)
def test_any_valid_claim_round_trips(claim: Claim) -> None:
    assert Claim.from_dict(claim.to_dict()) == claim
    assert Claim.from_dict(claim.to_dict()).to_dict() == claim.to_dict()
