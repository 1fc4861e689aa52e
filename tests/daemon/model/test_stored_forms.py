"""The model reads what the current release stored, and writes it back the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from computegroups.daemon.model.claims import Claim
from computegroups.daemon.model.decoding import to_plain
from computegroups.daemon.model.deployment import DeploymentSpec
from computegroups.daemon.model.requests import (
    ComponentRequest,
    ComponentSpec,
    ReservationSpec,
)

FIXTURE = Path(__file__).parents[2] / "statefiles" / "fixtures" / "state-0.1.0.json"


def state() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    return data


def test_every_stored_component_spec_decodes_and_encodes_back() -> None:
    components = state()["components"]
    assert components
    for name, record in components.items():
        stored = dict(record["spec"])
        # Release 0.1.0 also kept the replica count in the spec; schema 2 keeps it on the record only.
        stored.pop("replicas", None)
        spec = msgspec.convert(stored, ComponentSpec)
        # Fields added since 0.1.0 encode at their defaults: an old component keeps what it ran with.
        added = {"time_limit_s": None, "group": None, "cpu_bind": None}
        assert to_plain(spec) == {**stored, **added, "restart": {"policy": None, **stored["restart"]}}, name
        assert ComponentRequest.from_spec(name, spec).spec() == spec, name


def test_every_stored_claim_decodes_to_the_same_canonical_form() -> None:
    doc = state()
    claims = [g["claim"] for g in doc["groups"].values()]
    claims += [c["spec"]["claim"] for c in doc["components"].values() if c["spec"]["claim"] is not None]
    assert claims
    for claim in claims:
        assert Claim.from_dict(claim).to_dict() == claim
        assert to_plain(msgspec.convert(claim, Claim)) == claim


def test_every_stored_reservation_spec_decodes() -> None:
    reservations = state()["reservations"]
    assert reservations
    for record in reservations.values():
        assert to_plain(msgspec.convert(record["spec"], ReservationSpec)) == record["spec"]


def test_every_stored_deployment_spec_decodes_and_encodes_back() -> None:
    deployments = state()["deployments"]
    assert deployments
    for record in deployments.values():
        assert DeploymentSpec.from_dict(record["spec"]).to_dict() == record["spec"]
