"""Request bodies: duplicate keys refused, JSON errors explained, decoding straight into the model."""

from __future__ import annotations

import pytest

from computegroups.daemon.api.body import duplicate_key, not_json
from computegroups.daemon.model.decoding import ModelError, decode_json
from computegroups.daemon.model.requests import ComponentRequest, ScaleRequest


@pytest.mark.parametrize("raw, key", [
    (b'{"name": "a", "name": "b"}', "name"),
    (b'{"name": "a", "claim": {"gpus": 1, "gpus": 2}}', "gpus"),
    (b'{"name": "a", "n\\u0061me": "b"}', "name"),
    (b'{"claim": {"affinity": [{"component": "x", "level": "numa", "level": "device"}]}}', "level"),
])
def test_a_key_given_twice_in_one_object_is_found(raw: bytes, key: str) -> None:
    assert duplicate_key(raw) == key


@pytest.mark.parametrize("raw", [
    b'{"name": "a", "claim": {"gpus": 1}}',
    # The same key in different objects is no duplicate.
    b'{"claim": {"affinity": [{"component": "x"}, {"component": "y"}]}}',
    # Key-like text inside a value is not a key.
    b'{"name": "a", "command": ["echo", "\\"name\\": 1"], "env": {"name": "x"}}',
    b'{"name": 1',
])
def test_distinct_keys_pass(raw: bytes) -> None:
    assert duplicate_key(raw) is None


def test_bodies_decode_into_the_model_with_path_first_refusals() -> None:
    request = decode_json(b'{"name": "web", "claim": {"memory_mib": "2GiB"}}', ComponentRequest)
    assert request.claim is not None and request.claim.memory_mib == 2048
    with pytest.raises(ModelError, match=r"^claim\.compute_pct: must be between 1 and 100, got 150$"):
        decode_json(b'{"name": "web", "claim": {"compute_pct": 150}}', ComponentRequest)
    with pytest.raises(ModelError, match=r"^replicas: required$"):
        decode_json(b"{}", ScaleRequest)
    with pytest.raises(ModelError, match=r"^body: expected an object, got \[\]$"):
        decode_json(b"[]", ScaleRequest)


def test_bodies_that_are_not_json_say_why() -> None:
    assert "not valid JSON" in str(not_json(b'{"a": 1', ValueError("truncated")))
    assert "lone UTF-16 surrogate" in str(not_json(b'{"a": "\\ud800"}', ValueError("x")))
