"""API bodies are validated field by field before the manager sees them."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from computegroups.daemon.model.requests import (
    ComponentRequest,
    RequestError,
    check_name,
    parse_component,
    parse_reservation,
    parse_scale,
)


def test_full_component_round_trips_through_the_stored_spec() -> None:
    body = {
        "name": "web", "claim": {"gpus": 2, "colocate": "nvlink"}, "replicas": 3,
        "scope": "all-replicas", "command": ["python", "serve.py"], "env": {"MODEL": "x"},
        "cwd": "/srv", "restart": {"max_retries": 2, "backoff_s": 0.5}, "stop_timeout_s": 5,
    }
    request = parse_component(body)
    assert request.claim is not None and request.claim.gpus == 2
    again = ComponentRequest.from_spec("web", request.spec())
    # The replica count lives on the component record, not in the stored spec.
    assert again == replace(request, replicas=1)


@pytest.mark.parametrize("name", ["", "-x", "A", "a/b", "..", "a" * 64, "a_b", "é"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(RequestError, match="not a valid name"):
        check_name(name)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "body: expected an object, got \\[\\]"),
        ({"claim": {"gpus": 1}}, "name: required"),
        ({"name": "a", "colour": 1}, "colour: unknown field"),
        ({"name": "a", "claim": {"gpus": "2"}}, "claim.gpus"),
        ({"name": "a", "replicas": True}, "replicas: expected an integer"),
        ({"name": "a", "replicas": 0}, "replicas: must be between 1"),
        ({"name": "a", "scope": "some"}, "scope: must be one of"),
        ({"name": "a", "command": []}, "command: may not be empty"),
        ({"name": "a", "command": ["x", 3]}, r"command\[1\]"),
        ({"name": "a", "command": ["a b", "c"], "shell": True}, "shell: needs a command of exactly one"),
        ({"name": "a", "env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env.CUDA_VISIBLE_DEVICES"),
        ({"name": "a", "env": {"CG_ROLE": "primary"}}, "env.CG_ROLE"),
        ({"name": "a", "env": {"1X": "y"}}, "not a valid variable name"),
        ({"name": "a", "env": {"X": 1}}, "env.X: expected a string"),
        ({"name": "a", "restart": {"tries": 1}}, "restart.tries: unknown field"),
        ({"name": "a", "claim": {"gpus": 1}, "share_with": "b"}, "claim: not allowed with share_with"),
        ({"name": "a", "share_with": "b", "shadow_of": "c"}, "cannot be combined"),
        ({"name": "a", "share_with": "a"}, "cannot share with itself"),
        ({"name": "a", "stop_timeout_s": -1}, "stop_timeout_s: must be between"),
    ],
)
def test_malformed_component_bodies_name_the_field(body, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        parse_component(body)


def test_reservation_and_scale_bodies() -> None:
    res = parse_reservation({"name": "later", "claim": {"gpus": 1}, "ttl_s": 60})
    assert res.ttl_s == 60.0 and res.replicas == 1
    with pytest.raises(RequestError, match="claim: required"):
        parse_reservation({"name": "later"})
    with pytest.raises(RequestError, match="ttl_s: must be between"):
        parse_reservation({"name": "later", "claim": {"gpus": 1}, "ttl_s": 0})
    assert parse_scale({"replicas": 0}) == 0
    with pytest.raises(RequestError, match="replicas: required"):
        parse_scale({})
