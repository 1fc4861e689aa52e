"""The records' JSON form: round trips, and strict refusals that name the JSON path."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from computegroups.daemon.model.claims import Claim
from computegroups.statefiles import (
    SCHEMA_VERSION,
    ComponentState,
    DeviceRecord,
    GroupRecord,
    GroupState,
    Role,
    Scope,
    StateDoc,
    StateFormatError,
    WorkerRecord,
    worker_key,
)
from computegroups.statefiles.validation import convert
from computegroups.topology.model import DomainKind
from tests.statefiles.samples import populated_doc


def to_json(doc: Any) -> Any:
    """The document as a file parses: lists, not tuples."""
    return msgspec.json.decode(msgspec.json.encode(doc))


def from_json(data: Any) -> StateDoc:
    return convert(data, StateDoc)


def test_round_trip_keeps_every_field() -> None:
    doc = populated_doc()
    data = to_json(doc)
    again = from_json(data)
    assert again == doc
    assert to_json(again) == data
    assert isinstance(again.groups["web-0"].devices, tuple)
    assert again.groups["web-0"].domain == (0, 1)


def test_states_are_enums_that_still_compare_as_their_strings() -> None:
    doc = from_json(to_json(populated_doc()))
    group, worker = doc.groups["web-0"], doc.workers["web/0"]
    assert group.state is GroupState.ALLOCATED and str(group.state) == "allocated"
    assert group.scope is Scope.PER_REPLICA and worker.role is Role.PRIMARY
    assert doc.components["web"].state is ComponentState.RUNNING
    assert f"{group.state}/{worker.role}" == "allocated/primary"


def test_the_empty_state() -> None:
    doc = StateDoc()
    assert (doc.generation, doc.machine, doc.groups, doc.drained) == (0, None, {}, ())
    assert from_json(to_json(doc)) == doc


def test_records_are_frozen_and_replaceable() -> None:
    doc = populated_doc()
    with pytest.raises(AttributeError):
        doc.groups["web-0"].state = GroupState.DRAINING  # type: ignore[misc]
    doc.groups["web-1"] = msgspec.structs.replace(doc.groups["web-1"], users=("web", "standby"))
    again = from_json(to_json(doc))
    assert again.groups["web-0"].state == "allocated"
    assert again.groups["web-1"].users == ("web", "standby")


def test_maps_load_in_sorted_key_order() -> None:
    data = to_json(populated_doc())
    assert list(from_json(data).groups) == sorted(data["groups"])


def _mutated(change: Any) -> dict[str, Any]:
    data = copy.deepcopy(to_json(populated_doc()))
    change(data)
    return data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["groups"]["web-0"]["devices"][0].update(memory_mib="80G"),
         'groups["web-0"].devices[0].memory_mib: expected int, got string'),
        (lambda d: d["groups"]["web-0"]["devices"][0].update(whole=1),
         'groups["web-0"].devices[0].whole: expected boolean, got int'),
        (lambda d: d["groups"]["web-0"]["devices"][0].update(compute_pct=True),
         'groups["web-0"].devices[0].compute_pct: expected int, got boolean'),
        (lambda d: d["groups"]["web-0"]["devices"][0].update(compute_pct=101),
         'groups["web-0"].devices[0].compute_pct: must be between 0 and 100, got 101'),
        (lambda d: d["groups"]["web-0"].update(color="red"), 'groups["web-0"].color: unknown key'),
        (lambda d: d["groups"]["web-0"].pop("owner"), 'groups["web-0"].owner: missing'),
        (lambda d: d["groups"]["web-0"].update(state="released"),
         'groups["web-0"].state: must be one of reserved, allocated, draining, degraded, lost'),
        (lambda d: d["groups"]["web-0"].update(scope="each"), 'groups["web-0"].scope: must be one of'),
        (lambda d: d["groups"]["web-0"].update(domain=[0, -1]), 'groups["web-0"].domain[1]: must be >= 0'),
        (lambda d: d["groups"]["web-0"].update(users=["web", "web"]),
         "groups[\"web-0\"].users[1]: duplicate 'web'"),
        (lambda d: d["groups"]["web-0"].update(id="web-9"), 'groups["web-0"]: id must match the key'),
        (lambda d: d["groups"]["web-0"].update(devices={"0": {}}),
         'groups["web-0"].devices: expected list, got object'),
        (lambda d: d["groups"].update({"x": []}), 'groups["x"]: expected object, got list'),
        (lambda d: d["components"]["web"].update(created="yesterday"),
         'components["web"].created: expected number, got string'),
        (lambda d: d["components"]["web"].update(owner_uid=-1), 'components["web"].owner_uid: must be >= 0'),
        (lambda d: d["workers"]["web/0"].update(create_time=None),
         'workers["web/0"].create_time: required with a pid'),
        (lambda d: d["workers"]["web/0"].update(role="backup"), 'workers["web/0"].role: must be one of'),
        (lambda d: d["workers"].update({"web/1": d["workers"]["web/0"]}),
         'workers["web/1"]: <component>/<replica> must match the key \'web/1\', got \'web/0\''),
        (lambda d: d["groups"]["web-0"].update(owner_gid=None), 'groups["web-0"].owner_gid: expected int, got null'),
        (lambda d: d.update(drained=[0]), "drained[0]: expected string, got int"),
        (lambda d: d.update(drained=["GPU-aaaa", "GPU-aaaa"]), "drained[1]: duplicate"),
        (lambda d: d.update(machine={"hostname": "box"}), "machine.gpu_uuids: missing"),
        (lambda d: d.update(generation=-3), "generation: must be >= 0"),
        (lambda d: d.update(schema_version=SCHEMA_VERSION + 1),
         f"schema_version: must be {SCHEMA_VERSION} once loaded"),
        (lambda d: d["reservations"]["night"].update(expires_at=None),
         'reservations["night"].expires_at: expected number'),
        (lambda d: d["deployments"]["site"].update(source=7),
         'deployments["site"].source: expected string or null, got int'),
        (lambda d: d["groups"]["web-0"].update(state=None),
         'groups["web-0"].state: expected string, got null'),
        (lambda d: d["workers"]["web/0"].update(pid=0), 'workers["web/0"].pid: must be >= 1, got 0'),
        (lambda d: d["components"].update({3: d["components"]["web"]}), "components: object keys must be strings"),
    ],
)
def test_wrong_values_are_refused_with_their_path(change: Any, message: str) -> None:
    with pytest.raises(StateFormatError) as refused:
        from_json(_mutated(change))
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize("value", [[], "state", None, 3])
def test_a_document_that_is_not_an_object_is_refused(value: Any) -> None:
    with pytest.raises(StateFormatError, match=r"^top level: expected object"):
        from_json(value)


def test_a_record_alone_is_checked_the_same_way() -> None:
    with pytest.raises(StateFormatError, match=r"^devices\[0\]\.gpu_uuid: expected string, got null"):
        convert({
            "id": "g", "claim": {"gpus": 1}, "state": "allocated", "owner": "o", "owner_uid": 0, "owner_gid": 0,
            "users": [], "scope": "all-replicas",
            "replica": None, "domain": None, "exclusive_domain": None, "priority": 0, "created": 0,
            "explanation": "", "devices": [{"gpu_index": 0, "gpu_uuid": None, "mig_uuid": None,
                                           "memory_mib": 1, "compute_pct": 1, "whole": True}],
        }, GroupRecord)


def test_ints_are_accepted_where_a_number_is_expected() -> None:
    data = to_json(populated_doc())
    data["components"]["web"]["created"] = 1700000000
    created = from_json(data).components["web"].created
    assert created == 1700000000.0 and type(created) is float


def test_worker_key_matches_the_record_and_ignores_the_role() -> None:
    worker = WorkerRecord(component="web", replica=3, role=Role.SHADOW)
    assert worker.key == worker_key("web", 3) == "web/3"
    assert msgspec.structs.replace(worker, role="primary").key == worker.key


_names = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12)
_json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
_json = st.recursive(_json_leaf, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
_device = st.builds(DeviceRecord, gpu_index=st.integers(0, 15), gpu_uuid=_names,
                    mig_uuid=st.none() | _names, memory_mib=st.integers(0, 10**6),
                    compute_pct=st.integers(0, 100), whole=st.booleans())


_claims = st.sampled_from([Claim(gpus=1), Claim(gpus=4, colocate=DomainKind.NVLINK), Claim(memory_mib=20480),
                           Claim(memory_mib=1024, compute_pct=10, priority=3), Claim(mig="1g.10gb")])


@st.composite
def _groups(draw: st.DrawFn) -> dict[str, GroupRecord]:
    ids = draw(st.lists(_names, max_size=4, unique=True))
    return {gid: GroupRecord(
        id=gid, claim=draw(_claims),
        devices=tuple(draw(st.lists(_device, max_size=3))),
        state=draw(st.sampled_from(GroupState)),
        owner=draw(_names), owner_uid=draw(st.integers(0, 2**32)), owner_gid=draw(st.integers(0, 2**32)),
        users=tuple(draw(st.lists(_names, max_size=3, unique=True))),
        scope=draw(st.sampled_from(Scope)), replica=draw(st.none() | st.integers(0, 9)),
        domain=draw(st.none() | st.tuples(st.integers(0, 15))), priority=draw(st.integers(-5, 5)),
        created=draw(st.floats(0, 2e9)), explanation=draw(st.text(max_size=20)),
    ) for gid in ids}


@settings(max_examples=60, deadline=None)
@given(groups=_groups(), drained=st.lists(_names, max_size=3, unique=True), generation=st.integers(0, 2**40))
def test_any_valid_state_survives_a_round_trip(groups: dict[str, GroupRecord], drained: list[str],
                                                generation: int) -> None:
    doc = StateDoc(generation=generation, groups=groups, drained=tuple(drained))
    assert from_json(to_json(doc)) == doc
