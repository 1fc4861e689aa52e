"""Damaged state files: the backup is used loudly, and two bad files are a refusal, never an empty state."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import pytest

from computegroups.daemon.model.enums import GroupState
from computegroups.statefiles import SCHEMA_VERSION, StateCorruptError, StateDoc, StateStore, StateVersionError
from tests.statefiles.samples import commit, edit, populated_doc
from tests.statefiles.test_migrations import RELEASE_0_1_0


@pytest.fixture
def two_generations(store: StateStore) -> StateStore:
    """Generation 1 (web-1 draining) in the backup, generation 2 (web-1 allocated) in the state file
    and in the journal that followed the backup."""
    commit(store, populated_doc())
    with store.transaction() as doc:
        edit(doc.groups, "web-1", state=GroupState.ALLOCATED)
    return store


def _truncated(raw: bytes) -> bytes:
    return raw[: len(raw) // 2]


def _garbage(raw: bytes) -> bytes:
    return bytes(range(256)) * 8


def _zeros(raw: bytes) -> bytes:
    return b"\0" * len(raw)


def _empty(raw: bytes) -> bytes:
    return b""


def _last_byte_lost(raw: bytes) -> bytes:
    return raw[:-3]


def _flipped_value(raw: bytes) -> bytes:
    """Still valid JSON of the right shape: only the checksum can tell."""
    return raw.replace(b'"memory_mib": 20000', b'"memory_mib": 90000', 1)


def _wrong_shape(raw: bytes) -> bytes:
    data = json.loads(raw)
    data.pop("checksum")
    data["groups"]["web-0"]["devices"][0]["memory_mib"] = "lots"
    return json.dumps(data).encode()


def _not_an_object(raw: bytes) -> bytes:
    return b'["schema_version", 1]'


def _reformatted(raw: bytes) -> bytes:
    return json.dumps(json.loads(raw), indent=4).encode()


DAMAGE = {
    "truncated": (_truncated, "truncated: the JSON stops after"),
    "garbage bytes": (_garbage, "not UTF-8 text"),
    "zeroed": (_zeros, "not valid JSON"),
    "empty": (_empty, "empty file"),
    "closing brace lost": (_last_byte_lost, "truncated"),
    "changed value": (_flipped_value, "checksum mismatch"),
    "wrong shape": (_wrong_shape, r'groups\["web-0"\]\.devices\[0\]\.memory_mib: expected int, got string'),
    "not an object": (_not_an_object, "top level: expected object, got list"),
    "re-formatted with its checksum": (_reformatted, "not laid out as cgd writes it"),
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_bad_state_file_falls_back_to_the_backup_loudly(
        two_generations: StateStore, caplog: pytest.LogCaptureFixture, damage: tuple) -> None:
    store = two_generations
    spoil, reason = damage
    store.path.write_bytes(spoil(store.path.read_bytes()))
    with caplog.at_level(logging.WARNING, logger="computegroups.statefiles"):
        doc = store.load()
    assert doc.generation == 2, "the backup and the journal after it hold every change"
    assert doc.groups["web-1"].state == "allocated"
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = warning.getMessage()
    assert str(store.path) in message and str(store.backup_path) in message
    assert re.search(reason, message)


def test_writing_after_a_fallback_keeps_the_bad_file_and_the_good_backup(
        two_generations: StateStore, caplog: pytest.LogCaptureFixture) -> None:
    store = two_generations
    store.path.write_bytes(b"{ not json")
    backup = store.backup_path.read_bytes()
    with caplog.at_level(logging.WARNING, logger="computegroups.statefiles"), store.transaction() as doc:
        doc.drained = ()
    assert store.load().generation == 3
    assert store.backup_path.read_bytes() == backup
    [kept] = store.directory.glob("state.json.corrupt-*")
    assert kept.read_bytes() == b"{ not json"


def test_a_missing_state_file_with_a_backup_uses_the_backup(
        two_generations: StateStore, caplog: pytest.LogCaptureFixture) -> None:
    store = two_generations
    store.path.unlink()
    with caplog.at_level(logging.WARNING, logger="computegroups.statefiles"):
        assert store.load().generation == 2
    assert "missing" in caplog.text and str(store.backup_path) in caplog.text


def test_a_bad_state_file_without_a_backup_is_a_refusal(store: StateStore) -> None:
    commit(store, populated_doc())
    assert not store.backup_path.exists()
    store.path.write_bytes(_truncated(store.path.read_bytes()))
    with pytest.raises(StateCorruptError) as refused:
        store.load()
    message = str(refused.value)
    assert str(store.path) in message and str(store.backup_path) in message
    assert "truncated" in message and "is missing" in message and "Refusing to start from an empty state" in message
    with pytest.raises(StateCorruptError), store.transaction():
        pass
    assert store.path.exists(), "a refusal changes nothing"


@pytest.mark.parametrize("spoil_backup", [_garbage, _wrong_shape, _empty], ids=["garbage", "wrong shape", "empty"])
def test_both_files_bad_is_a_refusal_naming_both(two_generations: StateStore, spoil_backup: object) -> None:
    store = two_generations
    store.path.write_bytes(_truncated(store.path.read_bytes()))
    store.backup_path.write_bytes(spoil_backup(store.backup_path.read_bytes()))  # type: ignore[operator]
    with pytest.raises(StateCorruptError) as refused:
        store.load()
    message = str(refused.value)
    assert f"state file {store.path} is unusable (truncated" in message
    assert f"its backup {store.backup_path} (" in message
    with pytest.raises(StateCorruptError), store.transaction() as doc:
        doc.drained = ()
    assert not list(store.directory.glob("state.json.corrupt-*"))


def test_an_unreadable_state_file_is_an_error_not_a_fallback(two_generations: StateStore) -> None:
    store = two_generations
    store.path.unlink()
    store.path.mkdir()
    with pytest.raises(Exception, match=f"cannot read state file {re.escape(str(store.path))}"):
        store.load()


def test_a_hand_edited_file_without_checksum_loads_with_a_warning_and_is_sealed_again(
        two_generations: StateStore, caplog: pytest.LogCaptureFixture) -> None:
    store = two_generations
    data = json.loads(store.path.read_bytes())
    del data["checksum"]
    data["groups"]["web-1"]["state"] = "degraded"
    store.path.write_text(json.dumps(data, indent=4))
    with caplog.at_level(logging.WARNING, logger="computegroups.statefiles"):
        assert store.load().groups["web-1"].state == "degraded"
    assert "no checksum" in caplog.text
    with store.transaction():
        pass
    assert store.load().generation == 3
    assert b'"checksum": "sha256:' in store.path.read_bytes()


def test_a_newer_schema_is_refused_even_with_a_good_backup(two_generations: StateStore) -> None:
    store = two_generations
    data = json.loads(store.path.read_bytes())
    data["schema_version"] = 9
    store.path.write_text(json.dumps(data))
    with pytest.raises(StateVersionError) as refused:
        store.load()
    message = str(refused.value)
    assert str(store.path) in message and "schema version 9" in message and "upgrade computegroups" in message


def test_a_bad_state_file_with_a_newer_backup_is_refused(two_generations: StateStore) -> None:
    store = two_generations
    store.path.write_bytes(b"")
    store.backup_path.write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(StateVersionError, match=re.escape(str(store.backup_path))):
        store.load()


def test_leftovers_of_a_crashed_write_are_ignored(two_generations: StateStore) -> None:
    store = two_generations
    (store.directory / "state.json.tmp").write_bytes(b"{ half")
    (store.directory / "state.json.bak.tmp").write_bytes(b"{ half")
    assert store.load().generation == 2
    with store.transaction() as doc:
        doc.drained = ()
    assert store.load().generation == 3
    assert not (store.directory / "state.json.bak.tmp").exists()


def test_only_the_absence_of_both_files_is_an_empty_state(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    assert store.load() == StateDoc()
    store.backup_path.write_bytes(b"garbage")
    with pytest.raises(StateCorruptError, match="is unusable \\(missing\\)"):
        store.load()
    os.unlink(store.backup_path)
    store.path.write_bytes(b"")
    with pytest.raises(StateCorruptError):
        store.load()


def test_a_file_cut_anywhere_falls_back_to_the_backup(two_generations: StateStore,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    store = two_generations
    whole = store.path.read_bytes()
    cuts = sorted({*range(0, len(whole), max(1, len(whole) // 300)), *range(len(whole) - 80, len(whole) - 1)})
    for cut in cuts:
        store.path.write_bytes(whole[:cut])
        with caplog.at_level(logging.WARNING, logger="computegroups.statefiles"):
            assert store.load().generation == 2, f"cut at byte {cut}"
    store.path.write_bytes(whole[:-1])
    assert store.load().generation == 2, "only the final newline lost: nothing is missing"


def _from_the_backup(store: StateStore) -> StateDoc:
    """What loading finds if the state file is lost: the backup and every journal after it."""
    backup = StateStore(store.directory)
    backup.path = store.backup_path
    return backup.load()


def test_the_backup_and_the_journals_still_reach_every_change_after_a_fallback(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state", snapshot_every=3)
    for n in range(1, 8):
        with store.transaction() as doc:
            doc.drained = (f"GPU-{n}",)
    store.path.write_bytes(b"{ not json")
    with store.transaction() as doc:
        doc.drained = ("GPU-8",)
    assert StateStore(store.directory).load().drained == ("GPU-8",)
    found = _from_the_backup(store)
    assert (found.generation, found.drained) == (8, ("GPU-8",))
    for n in range(9, 14):  # and past the snapshots that follow
        with store.transaction() as doc:
            doc.drained = (f"GPU-{n}",)
        assert _from_the_backup(store) == StateStore(store.directory).load()


def test_a_rewrite_that_changes_nothing_leaves_no_generation_out_of_the_journals(journaled: StateStore) -> None:
    """cgd's first transaction after an upgrade writes the migrated state at a new generation: the
    backup (the file before the upgrade) and the journals must still reach every generation after it."""
    store = journaled
    store.directory.mkdir(parents=True)
    store.path.write_bytes(RELEASE_0_1_0.read_bytes())
    with (upgrade := store.transaction()):
        pass
    assert upgrade.written and upgrade.generation == 15
    with store.transaction() as doc:
        doc.drained = ()
    store.path.write_bytes(b"{ not json")
    found = store.load()
    assert (found.generation, found.drained) == (16, ())


def test_a_hand_edit_sealed_again_leaves_no_generation_out_of_the_journals(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state", snapshot_every=2)
    commit(store, populated_doc())
    with store.transaction() as doc:
        doc.drained = ()
    data = json.loads(store.path.read_bytes())
    del data["checksum"]
    store.path.write_text(json.dumps(data))
    with store.transaction():
        pass
    with store.transaction() as doc:
        doc.drained = ("GPU-x",)
    assert _from_the_backup(store) == StateStore(store.directory).load()
