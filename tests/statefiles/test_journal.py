"""The journal on its own: what a crash may leave at its end is dropped loudly, any other damage is refused."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from computegroups.statefiles import SCHEMA_VERSION, StateCorruptError, StateStore, StateVersionError
from tests.statefiles.samples import commit, populated_doc


@pytest.fixture
def four(journaled: StateStore) -> StateStore:
    """Generation 1 (the whole document) and 2 to 4 (one drained GPU each), all in the journal."""
    commit(journaled, populated_doc())
    for n in range(2, 5):
        with journaled.transaction() as doc:
            doc.drained = (f"GPU-{n}",)
    assert not journaled.path.exists(), "no snapshot yet: every generation is a journal line"
    return journaled


def _lines(store: StateStore) -> list[bytes]:
    return store.journal_path.read_bytes().splitlines(keepends=True)


def _sealed(entry: dict[str, object]) -> bytes:
    """A line as the store writes it: sound checksum over whatever `entry` says."""
    body = json.dumps(entry, separators=(",", ":")).encode()
    return b"%b sha256:%b\n" % (body, hashlib.sha256(body).hexdigest().encode())


def _reseal(line: bytes, **changes: object) -> bytes:
    entry = json.loads(line.rpartition(b" sha256:")[0])
    entry.update(changes)
    return _sealed(entry)


def test_a_damaged_entry_with_entries_after_it_is_refused(four: StateStore) -> None:
    lines = _lines(four)
    lines[2] = lines[2].replace(b"GPU-3", b"GPU-9")  # the checksum no longer matches
    four.journal_path.write_bytes(b"".join(lines))
    with pytest.raises(StateCorruptError, match=r"entry at byte \d+ is damaged \(checksum mismatch\) and entries "
                                                r"follow it"):
        four.load()
    with pytest.raises(StateCorruptError), StateStore(four.directory).transaction():
        pass
    assert four.journal_path.read_bytes() == b"".join(lines), "a refusal cuts nothing"


def test_a_missing_generation_is_refused(four: StateStore) -> None:
    lines = _lines(four)
    del lines[2]
    four.journal_path.write_bytes(b"".join(lines))
    with pytest.raises(StateCorruptError, match="continues at generation 4 after 2: generations 3 to 3 are missing"):
        four.load()


def test_replay_is_idempotent(four: StateStore) -> None:
    first = StateStore(four.directory).load()
    assert StateStore(four.directory).load() == first, "loading twice"
    lines = _lines(four)
    four.journal_path.write_bytes(b"".join(lines[:3] + lines[1:]))  # generations 2 and 3 a second time
    again = StateStore(four.directory).load()
    assert again == first and again.drained == ("GPU-4",)


def test_entries_the_snapshot_holds_are_skipped(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state", snapshot_every=3)
    commit(store, populated_doc())
    for n in range(2, 6):
        with store.transaction() as doc:
            doc.drained = (f"GPU-{n}",)
    old = store.journal_backup_path.read_bytes()
    assert old, "the snapshot at generation 3 moved generations 1 to 3 aside"
    store.journal_path.write_bytes(old + store.journal_path.read_bytes())  # as if the move had not happened
    loaded = StateStore(store.directory).load()
    assert (loaded.generation, loaded.drained) == (5, ("GPU-5",))


def test_an_entry_of_a_newer_schema_is_refused(four: StateStore) -> None:
    lines = _lines(four)
    lines[-1] = _reseal(lines[-1], schema_version=SCHEMA_VERSION + 1)
    four.journal_path.write_bytes(b"".join(lines))
    with pytest.raises(StateVersionError, match=f"written by schema version {SCHEMA_VERSION + 1}.*upgrade"):
        four.load()


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"schema_version": SCHEMA_VERSION - 1}, "entries are never migrated"),
        ({"drained": ["GPU-x", "GPU-x"]}, "duplicate GPU"),
        ({"groups": {"web-0": {"id": "web-0"}}}, r"groups\[\"web-0\"\]"),
        ({"unknown": 1}, "unknown"),
    ],
    ids=["older schema", "broken rule", "wrong shape", "unknown field"],
)
def test_a_whole_sealed_last_line_that_does_not_validate_is_refused_not_dropped(
        four: StateStore, change: dict[str, object], problem: str) -> None:
    """A crash cannot write a whole line with its right checksum: such a line was acknowledged, then changed."""
    lines = _lines(four)
    lines[-1] = _reseal(lines[-1], **change)
    four.journal_path.write_bytes(b"".join(lines))
    with pytest.raises(StateCorruptError, match=rf"line 4 \(byte \d+\).*{problem}"):
        four.load()
    with pytest.raises(StateCorruptError), StateStore(four.directory).transaction():
        pass
    assert four.journal_path.read_bytes() == b"".join(lines), "a refusal cuts nothing"


def test_a_whole_last_line_with_a_bad_checksum_is_dropped_loudly_and_the_rest_loaded(
        four: StateStore, caplog: pytest.LogCaptureFixture) -> None:
    lines = _lines(four)
    lines[-1] = lines[-1].replace(b"GPU-4", b"GPU-?")
    four.journal_path.write_bytes(b"".join(lines))
    loaded = StateStore(four.directory).load()
    assert (loaded.generation, loaded.drained) == (3, ("GPU-3",))
    with caplog.at_level(logging.WARNING, logger="computegroups.statefiles"), \
            StateStore(four.directory).transaction() as doc:
        assert doc.generation == 3
        doc.drained = ()
    assert "ends in a damaged entry" in caplog.text and "checksum mismatch" in caplog.text
    [aside] = four.directory.glob("state.journal.corrupt-*")
    assert aside.read_bytes() == lines[-1]
    assert StateStore(four.directory).load().generation == 4
