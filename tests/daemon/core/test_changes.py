"""The events a commit makes, from two documents: no daemon needed."""

from __future__ import annotations

import copy

from msgspec.structs import replace

from computegroups.daemon.core.changes import state_changes, touched
from computegroups.daemon.model.claims import Claim
from computegroups.daemon.model.enums import ComponentState, GroupState, Role
from computegroups.statefiles import StateDoc, WorkerRecord
from tests.statefiles.samples import UUIDS, populated_doc

INDEX = {uuid: i for i, uuid in enumerate(UUIDS)}


def changes(before: StateDoc, after: StateDoc) -> list[tuple[str, str | None, int | None]]:
    found = state_changes(before, after, touched(before.components, after.components),
                          touched(before.workers, after.workers), touched(before.groups, after.groups), INDEX)
    return [(c.type, c.what.get("component") or c.what.get("group") or c.what.get("gpu_uuid"), c.uid)
            for c in found]


def test_nothing_changed_nothing_told() -> None:
    doc = populated_doc()
    assert changes(doc, copy.deepcopy(doc)) == []


def test_a_component_allocated_started_and_released() -> None:
    before = populated_doc()
    after = copy.deepcopy(before)
    after.components["batch"] = replace(before.components["web"], name="batch", deployment=None, created=2.0)
    after.workers["batch/0"] = WorkerRecord(component="batch", replica=0, role=Role.PRIMARY, pid=77,
                                            create_time=3.0)
    del after.components["standby"]
    assert changes(before, after) == [("allocated", "batch", 1000), ("released", "standby", 1000),
                                      ("worker_started", "batch", 1000)]


def test_queue_placement_and_ends() -> None:
    before = populated_doc()
    before.components["web"] = replace(before.components["web"], state=ComponentState.PENDING)
    placed = copy.deepcopy(before)
    placed.components["web"] = replace(before.components["web"], state=ComponentState.RUNNING)
    assert changes(before, placed) == [("placed", "web", 1000)]
    placed.components["web"] = replace(placed.components["web"], created=5.0)
    assert changes(before, placed) == [("placed", "web", 1000)], "placing makes a new record: still placed"
    dropped = copy.deepcopy(before)
    dropped.components["web"] = replace(before.components["web"], state=ComponentState.RELEASING)
    assert changes(before, dropped) == [], "a queued claim on its way out was never placed"
    del dropped.components["web"]
    assert changes(before, dropped) == [("released", "web", 1000)]
    ended = copy.deepcopy(placed)
    ended.components["web"] = replace(placed.components["web"], state=ComponentState.TIMEOUT)
    told = state_changes(placed, ended, ["web"], [], [], INDEX)
    assert [(c.type, c.what["outcome"]) for c in told] == [("failed", "timeout")]
    replaced = copy.deepcopy(ended)
    replaced.components["web"] = replace(ended.components["web"], state=ComponentState.RUNNING, created=9.0)
    assert changes(ended, replaced) == [("released", "web", 1000), ("allocated", "web", 1000)]


def test_restarts_promotions_and_drains() -> None:
    before = populated_doc()
    after = copy.deepcopy(before)
    web0, standby0 = before.workers["web/0"], before.workers["standby/0"]
    after.workers["web/0"] = replace(web0, restarts=web0.restarts + 1, pid=None, create_time=None, exit_code=3)
    after.workers["standby/0"] = replace(standby0, promotions=standby0.promotions + 1, role=Role.PRIMARY)
    after.groups["web-0"] = replace(before.groups["web-0"], state=GroupState.DRAINING)
    after.drained = (UUIDS[1],)
    assert changes(before, after) == [
        ("promoted", "standby", 1000), ("restarted", "web", 1000), ("drained", "web-0", 1000),
        ("drained", UUIDS[1], None), ("undrained", UUIDS[2], None)]


def test_an_allocated_components_gpus_come_from_the_groups_its_commit_touched() -> None:
    before = populated_doc()
    after = copy.deepcopy(before)
    after.components["side"] = replace(before.components["web"], name="side", deployment=None, created=2.0)
    web0 = after.groups["web-0"]
    after.groups["web-0"] = replace(web0, users=(*web0.users, "side/0"))  # a sharer attached: touched
    found = state_changes(before, after, ["side"], [], ["web-0"], INDEX)
    assert [(c.type, c.what["gpus"]) for c in found] == [("allocated", [d.gpu_index for d in web0.devices])]


def test_a_cpu_only_component_is_told_allocated_its_cpus_not_on_gpu_dash() -> None:
    before = populated_doc()
    after = copy.deepcopy(before)
    after.components["prep"] = replace(before.components["web"], name="prep", deployment=None, created=2.0)
    for n in range(2):
        after.groups[f"prep-{n}"] = replace(before.groups["web-0"], id=f"prep-{n}", claim=Claim(cpus=4), devices=(),
                                            owner="prep", users=(f"prep/{n}",), replica=n)
    found = state_changes(before, after, ["prep"], [], ["prep-0", "prep-1"], INDEX)
    assert [c.message for c in found] == ["prep allocated 8 CPUs"]
    assert found[0].what["gpus"] == []
    one = state_changes(before, after, ["prep"], [], ["prep-0"], INDEX)
    assert [c.message for c in one] == ["prep allocated 4 CPUs"]


def told(before: StateDoc, after: StateDoc, now: float = 0.0) -> list[tuple[str, str]]:
    found = state_changes(before, after, touched(before.components, after.components),
                          touched(before.workers, after.workers), touched(before.groups, after.groups), INDEX,
                          reservation_keys=touched(before.reservations, after.reservations), now=now)
    return [(c.type, c.message) for c in found]


def test_a_reservation_made_taken_expired_or_released() -> None:
    doc = populated_doc()
    before = copy.deepcopy(doc)
    del before.reservations["night"], before.groups["night-0"]
    assert told(before, doc) == [("reserved", "night reserved on GPU 3")]
    gone = copy.deepcopy(doc)
    del gone.reservations["night"], gone.groups["night-0"]
    assert told(doc, gone, now=1700090000.0) == [("unreserved", "reservation night expired")]
    assert told(doc, gone, now=1700000000.0) == [("unreserved", "reservation night released")]
    taken = copy.deepcopy(doc)
    del taken.reservations["night"]
    taken.components["night"] = replace(doc.components["web"], name="night", deployment=None, created=3.0)
    taken.groups["night-0"] = replace(doc.groups["night-0"], state=GroupState.ALLOCATED, users=("night/0",))
    assert ("unreserved", "reservation night taken by component night") in told(doc, taken)


def test_a_component_scaled_and_a_group_made_on_its_own_deleted_or_undrained() -> None:
    doc = populated_doc()
    scaled = copy.deepcopy(doc)
    scaled.components["web"] = replace(doc.components["web"], replicas=1)
    assert told(doc, scaled) == [("scaled", "web scaled from 2 to 1 replicas")]
    made = copy.deepcopy(doc)
    made.groups["group.1"] = replace(doc.groups["web-0"], id="group.1", owner="@1000", users=(), replica=None)
    assert told(doc, made) == [("group_created", "group group.1 made on GPU 0")]
    assert told(made, doc) == [("group_deleted", "group group.1 deleted")]
    undrained = copy.deepcopy(doc)
    undrained.groups["web-1"] = replace(doc.groups["web-1"], state=GroupState.ALLOCATED)
    assert told(doc, undrained) == [("undrained", "group web-1 undrained: it takes new users again")]
    assert told(undrained, doc) == [("drained", "group web-1 draining: nothing new attaches to it")]
    cpu = copy.deepcopy(doc)
    cpu.groups["group.2"] = replace(doc.groups["web-0"], id="group.2", owner="@1000", devices=(), users=(),
                                    claim=Claim(cpus=4), replica=None)
    assert told(doc, cpu) == [("group_created", "group group.2 made 4 CPUs")]
