"""The allocator's ledger is a view of the state document and never places against a stale copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from computegroups.daemon.core.transactions import Caller, StateKeeper, new_component_records
from computegroups.daemon.model.claims import AffinityTerm, Claim
from computegroups.daemon.model.config import DaemonConfig
from computegroups.daemon.model.errors import InsufficientCapacity
from computegroups.daemon.model.requests import ComponentRequest
from computegroups.statefiles.store import StateStore
from computegroups.topology import load_machine

ROOT = Caller(pid=1, uid=0, gid=0)


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
