"""msgspec's refusals in our words, for shapes the records may take once their specs are typed Structs."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import pytest

from computegroups.statefiles import ComponentRecord, DeploymentRecord, GroupRecord, StateFormatError
from computegroups.statefiles.validation import convert, opaque_fields


class Restart(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    max_retries: Annotated[int, msgspec.Meta(ge=0, le=100)] = 5


class Spec(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    command: tuple[str, ...] = ()
    env: dict[str, str] = {}
    restarts: dict[str, Restart] = {}


class Record(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: str
    spec: Spec | None = None


class Doc(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    records: dict[str, Record] = {}


def _doc(**spec: Any) -> dict[str, Any]:
    return {"records": {"a": {"name": "a"}, "b": {"name": "b", "spec": spec}}}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"env": {"X": 1}}, 'records["b"].spec.env["X"]: expected string, got int'),
        ({"restarts": {"web": {"max_retries": 101}}},
         'records["b"].spec.restarts["web"].max_retries: must be between 0 and 100, got 101'),
        ({"restarts": {"web": {"tries": 1}}},
         'records["b"].spec.restarts["web"].tries: unknown key (expected one of: max_retries)'),
        ({"command": "python"}, 'records["b"].spec.command: expected list, got string'),
        ({"command": ["python", None]}, 'records["b"].spec.command[1]: expected string, got null'),
    ],
)
def test_a_typed_spec_names_every_map_key_on_the_way(spec: dict[str, Any], message: str) -> None:
    """msgspec says `$.records[...].spec.env[...]`; the message names both keys."""
    with pytest.raises(StateFormatError) as refused:
        convert(_doc(**spec), Doc)
    assert str(refused.value) == message


def test_a_typed_spec_is_not_an_opaque_field() -> None:
    assert opaque_fields(Record) == ()
    assert opaque_fields(ComponentRecord) == ()
    assert opaque_fields(GroupRecord) == ()
    assert opaque_fields(DeploymentRecord) == ("spec",)
