"""The allocator's ledger is a view of the state document and never places against a stale copy."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest

from computegroups.daemon.core.consistency import StateContradiction
from computegroups.daemon.core.keeper import StateKeeper
from computegroups.daemon.core.transactions import Caller, attach_refs, new_component_records
from computegroups.daemon.core.views import component_view
from computegroups.daemon.core.workers import binder, groups_by_replica, visible_devices
from computegroups.daemon.model.claims import AffinityTerm, Claim
from computegroups.daemon.model.config import DaemonConfig, Limits
from computegroups.daemon.model.decoding import ModelError
from computegroups.daemon.model.errors import InsufficientCapacity, LimitReached, Stopping
from computegroups.daemon.model.requests import ComponentRequest, parse_component
from computegroups.daemon.supervision.workerenv import MpsSettings, OwnerEnv, worker_env
from computegroups.statefiles.store import StateStore
from computegroups.topology import load_machine

ROOT = Caller(pid=1, uid=0, gid=0)
R = TypeVar("R", bound=msgspec.Struct)


def changed(record: R, **fields: Any) -> R:
    """A copy of a state record with some fields changed, as a hand edit of the file would."""
    new = copy.copy(record)
    for name, value in fields.items():
        msgspec.structs.force_setattr(new, name, value)
    return new


def keeper(state: Path) -> StateKeeper:
    return StateKeeper(load_machine("dgx-h100"), StateStore(state), DaemonConfig())


def allocate(k: StateKeeper, name: str, claim: Claim) -> tuple[int, ...]:
    with k.transaction() as doc:
        new_component_records(doc, k, ComponentRequest(name=name, claim=claim), ROOT)
    return tuple(sorted({d.gpu_index for g in k.doc.groups.values() if g.owner == name for d in g.devices}))


def test_affinity_and_anti_affinity_see_a_component_allocated_a_moment_ago(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    (db,) = allocate(k, "db", Claim(memory_mib=1024))
    assert allocate(k, "cache", Claim(memory_mib=1024, affinity=(AffinityTerm("db"),))) == (db,)
    assert db not in allocate(k, "other", Claim(memory_mib=1024, anti_affinity=(AffinityTerm("db"),)))


def test_a_second_keeper_on_the_same_state_places_against_the_document_not_its_old_ledger(tmp_path: Path) -> None:
    first, second = keeper(tmp_path), keeper(tmp_path)
    taken = set(allocate(first, "big", Claim(gpus=7)))
    (last,) = allocate(second, "one", Claim(gpus=1))
    assert last not in taken
    with pytest.raises(InsufficientCapacity):
        allocate(first, "more", Claim(gpus=1))
    assert set(first.store.load().groups) == {"big-0", "one-0"}


def test_a_failed_decision_leaves_the_ledger_as_the_document_says(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    allocate(k, "a", Claim(gpus=4))
    with pytest.raises(InsufficientCapacity), k.transaction() as doc:
        new_component_records(doc, k, ComponentRequest(name="b", claim=Claim(gpus=2)), ROOT)
        new_component_records(doc, k, ComponentRequest(name="c", claim=Claim(gpus=4)), ROOT)
    assert {h.group_id for h in k.allocator.holdings()} == {"a-0"}
    assert len(allocate(k, "c", Claim(gpus=4))) == 4


def test_a_group_freed_earlier_in_the_same_transaction_can_be_placed_again(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    allocate(k, "a", Claim(gpus=8))
    with k.transaction() as doc:
        del doc.groups["a-0"]
        del doc.components["a"]
        new_component_records(doc, k, ComponentRequest(name="b", claim=Claim(gpus=8)), ROOT)
    assert {h.group_id: h.users for h in k.allocator.holdings()} == {"b-0": frozenset({"b"})}


def test_a_state_that_holds_a_gpu_twice_is_refused_with_the_groups_named(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    allocate(k, "a", Claim(gpus=1, gpu_ids=(3,)))
    allocate(k, "b", Claim(memory_mib=1024, gpu_ids=(4,)))
    with k.store.transaction() as doc:
        doc.groups["b-0"] = changed(doc.groups["b-0"], devices=tuple(
            changed(d, gpu_index=3, gpu_uuid=doc.groups["a-0"].devices[0].gpu_uuid)
            for d in doc.groups["b-0"].devices))
    with pytest.raises(StateContradiction, match=r"GPU 3 is held whole by group a-0 and also by group b-0"):
        keeper(tmp_path)


def test_shares_past_a_gpus_memory_are_refused(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    allocate(k, "a", Claim(memory_mib=40000, gpu_ids=(2,)))
    allocate(k, "b", Claim(memory_mib=40000, gpu_ids=(2,)))
    with k.store.transaction() as doc:
        doc.groups["b-0"] = changed(doc.groups["b-0"], devices=tuple(
                changed(d, memory_mib=60000) for d in doc.groups["b-0"].devices))
    with pytest.raises(StateContradiction, match=r"GPU 2 has 81559 MiB but groups a-0, b-0 hold 100000 MiB"):
        keeper(tmp_path)


def test_groups_on_a_gpu_that_is_gone_are_no_contradiction(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    allocate(k, "a", Claim(gpus=1, gpu_ids=(3,)))
    allocate(k, "b", Claim(gpus=1, gpu_ids=(4,)))
    with k.store.transaction() as doc:
        gone = tuple(changed(d, gpu_uuid="GPU-gone") for d in doc.groups["a-0"].devices)
        doc.groups["a-0"] = changed(doc.groups["a-0"], devices=gone)
        doc.groups["b-0"] = changed(doc.groups["b-0"], devices=gone)
    keeper(tmp_path)


def test_a_replica_budget_on_a_gpu_is_the_sum_of_its_shares_there_everywhere(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    allocate(k, "db", Claim(memory_mib=2048, compute_pct=10, gpu_ids=(1,)))
    with k.transaction() as doc:
        new_component_records(doc, k, ComponentRequest(name="side", claim=Claim(memory_mib=1024, gpu_ids=(1,))), ROOT)
        attach_refs(doc, ["db-0"], ["side/0"])
    groups = groups_by_replica(k.doc)["side/0"]
    (device,) = visible_devices(groups)
    assert (device.gpu_index, device.memory_mib, device.compute_pct, device.whole) == (1, 3072, 10, False)
    env = worker_env(owner=OwnerEnv(0, 0, "root", "/root", "/usr/bin", None), devices=visible_devices(groups),
                     component="side", replica=0, role="primary", groups=[g.id for g in groups],
                     role_file="/run/r", mps=MpsSettings("/run/mps"))
    assert env["CG_GPU_MEMORY_MIB"] == "3072" and env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=3072M"
    view = component_view(k.doc, k.doc.components["side"], {}, "indices", {}, binder(k.machine, k.config))
    assert [(d["index"], d["memory_mib"]) for d in view["replicas"][0]["devices"]] == [(1, 3072)]


def test_a_replaced_record_is_seen_by_the_next_placement(tmp_path: Path) -> None:
    """The ledger derives again only the groups that differ from what it followed."""
    k = keeper(tmp_path)
    (db,) = allocate(k, "db", Claim(memory_mib=1024, gpu_ids=(1,)))
    allocate(k, "side", Claim(memory_mib=1024, gpu_ids=(2,)))
    with k.transaction() as doc:
        doc.groups["db-0"] = changed(doc.groups["db-0"], users=("db/0", "side/0"))
    with pytest.raises(InsufficientCapacity, match="side"), k.transaction() as doc:
        new_component_records(doc, k, ComponentRequest(
            name="far", claim=Claim(memory_mib=1024, gpu_ids=(db,), anti_affinity=(AffinityTerm("side"),))), ROOT)
    with k.transaction() as doc:
        group = doc.groups["db-0"]
        doc.groups["db-0"] = changed(group, devices=(changed(group.devices[0], memory_mib=81559),))
    with pytest.raises(InsufficientCapacity), k.transaction() as doc:
        new_component_records(doc, k, ComponentRequest(name="more", claim=Claim(memory_mib=1024, gpu_ids=(db,))), ROOT)


def test_one_user_may_hold_only_so_many_components(tmp_path: Path) -> None:
    k = StateKeeper(load_machine("dgx-h100"), StateStore(tmp_path),
                    DaemonConfig(limits=Limits(components_per_user=2)))
    alice = Caller(pid=1, uid=4242, gid=4242)
    for name in ("a", "b"):
        with k.transaction() as doc:
            new_component_records(doc, k, ComponentRequest(name=name, claim=Claim(memory_mib=1024)), alice)
    with pytest.raises(LimitReached, match=r"has 2 components, the most one user may have "
                                           r"\(limits.components_per_user = 2\)"), k.transaction() as doc:
        new_component_records(doc, k, ComponentRequest(name="c", claim=Claim(memory_mib=1024)), alice)
    with k.transaction() as doc:  # root has no limit
        new_component_records(doc, k, ComponentRequest(name="c", claim=Claim(memory_mib=1024)), ROOT)
    assert set(k.doc.components) == {"a", "b", "c"}


def test_priorities_are_bounded() -> None:
    with pytest.raises(ModelError, match="priority"):
        parse_component({"name": "x", "claim": {"gpus": 1, "priority": 1001}})


def test_a_gpu_a_lost_worker_held_is_given_back_once(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from computegroups.daemon.core.base import ManagerBase
    from computegroups.daemon.core.lost import LostWorker

    k = keeper(tmp_path)
    freed: list[int] = []
    k.on_freed = lambda: freed.append(1)
    lost = LostWorker(replica="lost/0", user="alice", devices="0", gpus=(0,), processes=[])
    manager: Any = SimpleNamespace(keeper=k, lost_workers=[lost])
    ManagerBase.hold_lost_gpus(manager, [])
    assert k.unavailable_reasons(k.doc)[0].startswith("held by lost/0 of alice")
    allocate(k, "a", Claim(memory_mib=1024))  # a commit follows the document while GPU 0 is held
    assert 0 not in {d.gpu_index for g in k.doc.groups.values() for d in g.devices}
    ManagerBase.hold_lost_gpus(manager, [lost])
    assert manager.lost_workers == [] and freed == [1], "the queue is told GPU 0 came back"
    allocate(k, "b", Claim(memory_mib=1024))
    assert freed == [1], "and told once: the next commit sees no second freeing"


def test_a_gpu_healthy_again_is_given_back_once(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    freed: list[int] = []
    k.on_freed = lambda: freed.append(1)
    k.hold_out(unhealthy={3})
    allocate(k, "a", Claim(memory_mib=1024))
    k.hold_out(unhealthy=set())
    allocate(k, "b", Claim(memory_mib=1024))
    assert freed == [1]


def test_only_placed_claims_count_as_granted(tmp_path: Path) -> None:
    k = keeper(tmp_path)

    def granted() -> float | None:
        return k.instruments.registry.get_sample_value(
            "computegroups_allocations_total", {"Hostname": k.machine.hostname, "result": "granted"})

    allocate(k, "web", Claim(gpus=1))
    before = k.doc
    with k.transaction() as doc:
        new_component_records(doc, k, ComponentRequest(name="side", share_with="web"), ROOT)
        new_component_records(doc, k, ComponentRequest(name="standby", shadow_of="web"), ROOT)
    assert granted() == 1, "a sharer and a shadow attach to groups held already"
    k.restore(before)
    allocate(k, "other", Claim(gpus=1))
    k.restore(before)
    assert granted() == 2, "putting a document back grants nothing"


def test_a_stop_ends_every_wait_for_a_commit_then_and_later(tmp_path: Path) -> None:
    """cgd's stop answers the long polls at once (`Stopping`) instead of leaving them to the loop's end."""
    k = keeper(tmp_path)

    async def scenario() -> None:
        waiting = asyncio.ensure_future(k.changed(3600))
        await asyncio.sleep(0)  # the waiter is registered
        k.stop_waits()
        with pytest.raises(Stopping, match="cgd is stopping"):
            await asyncio.wait_for(waiting, 5)
        with pytest.raises(Stopping):
            await k.changed(3600)

    asyncio.run(scenario())
