"""A machine that lost a GPU: its groups are marked lost, never dropped."""

from __future__ import annotations

from computegroups.statefiles import StateStore, mark_lost, missing_gpus
from tests.statefiles.samples import UUIDS, commit, populated_doc


def test_groups_on_a_missing_gpu_become_lost_and_the_rest_is_untouched() -> None:
    doc, before = populated_doc(), populated_doc()
    assert mark_lost(doc, [UUIDS[0], UUIDS[2], UUIDS[3]]) is doc
    assert set(doc.groups) == set(before.groups)
    assert doc.groups["web-1"].state == "lost"
    assert doc.groups["web-1"].explanation == f"lost: GPU 1 ({UUIDS[1]}) is no longer on this machine"
    assert doc.groups["web-1"].devices == before.groups["web-1"].devices
    assert doc.groups["web-0"] == before.groups["web-0"]
    assert doc.groups["night-0"] == before.groups["night-0"]
    assert (doc.components, doc.workers, doc.reservations) == (before.components, before.workers, before.reservations)


def test_the_old_explanation_is_kept_after_the_reason() -> None:
    doc = mark_lost(populated_doc(), [UUIDS[1], UUIDS[3]])
    assert doc.groups["web-0"].explanation == (
        f"lost: GPU 0 ({UUIDS[0]}) is no longer on this machine; before: GPU 0: free, NVLink to GPU 1")


def test_a_lost_group_is_not_marked_again() -> None:
    doc = mark_lost(populated_doc(), UUIDS[1:])
    first = doc.groups["web-0"].explanation
    assert mark_lost(doc, UUIDS[1:]).groups["web-0"].explanation == first


def test_mig_devices_are_checked_only_when_the_caller_lists_them() -> None:
    assert mark_lost(populated_doc(), UUIDS).groups["night-0"].state == "reserved"
    doc = mark_lost(populated_doc(), UUIDS, mig_uuids=["MIG-2222"])
    assert doc.groups["night-0"].state == "lost"
    assert doc.groups["night-0"].explanation.startswith("lost: MIG device MIG-1111 on GPU 3")
    assert doc.groups["web-0"].state == "allocated"


def test_nothing_changes_on_the_same_machine() -> None:
    assert mark_lost(populated_doc(), UUIDS) == populated_doc()
    assert missing_gpus(populated_doc(), UUIDS) == ()


def test_missing_gpus_lists_known_uuids_no_longer_present() -> None:
    assert missing_gpus(populated_doc(), [UUIDS[0], UUIDS[3]]) == (UUIDS[1], UUIDS[2])


def test_lost_groups_survive_a_commit_and_a_reload(store: StateStore) -> None:
    commit(store, populated_doc())
    with store.transaction() as doc:
        mark_lost(doc, UUIDS[1:])
    reloaded = store.load()
    assert reloaded.groups["web-0"].state == "lost"
    assert len(reloaded.groups) == 3
