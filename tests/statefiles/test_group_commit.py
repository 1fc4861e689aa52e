"""Commits left to a later `sync()`: visible at once, durable when sync returns, one fsync for many."""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from computegroups.statefiles import StateError, StateStore
from tests.statefiles.samples import commit, populated_doc


def _fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        calls.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def test_an_unsynced_commit_is_visible_at_once_and_durable_after_sync(
        journaled: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store = journaled
    commit(store, populated_doc())
    assert store.durable_generation == 1
    calls = _fsyncs(monkeypatch)
    with (txn := store.transaction(sync=False)) as doc:
        doc.drained = ()
    assert txn.written and calls == []
    assert StateStore(store.directory).load().generation == 2
    assert store.durable_generation == 1
    store.sync(2)
    assert calls == ["file"] and store.durable_generation == 2
    store.sync(2)
    assert calls == ["file"], "a generation already durable costs nothing"


def test_one_sync_covers_every_commit_before_it(journaled: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store = journaled
    commit(store, populated_doc())
    calls = _fsyncs(monkeypatch)
    for n in range(5):
        with store.transaction(sync=False) as doc:
            doc.drained = (f"GPU-{n}",)
    store.sync()
    assert calls == ["file"]
    assert store.durable_generation == 6


def test_a_new_journal_is_made_durable_with_its_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = StateStore(tmp_path / "state")
    with store.transaction() as doc:
        doc.drained = ("GPU-x",)
    calls = _fsyncs(monkeypatch)
    store = StateStore(tmp_path / "fresh")
    with store.transaction(sync=False) as doc:
        doc.drained = ("GPU-y",)
    store.sync()
    assert calls[-2:] == ["file", "dir"], "the journal's name is on disk, not only its bytes"


def test_a_torn_unsynced_entry_is_dropped_loudly_and_the_next_follows_a_whole_line(
        journaled: StateStore, caplog: pytest.LogCaptureFixture) -> None:
    store = journaled
    commit(store, populated_doc())
    with store.transaction(sync=False) as doc:
        doc.drained = ("GPU-synced",)
    store.sync()
    with store.transaction(sync=False) as doc:
        doc.drained = ("GPU-lost",)
    whole = store.journal_path.read_bytes()
    store.journal_path.write_bytes(whole[:-20])  # what a power cut can leave of the unsynced last entry
    assert (store.load().generation, store.load().drained) == (2, ("GPU-synced",))
    reopened = StateStore(store.directory)
    with caplog.at_level("WARNING", logger="computegroups.statefiles"), reopened.transaction() as doc:
        assert doc.generation == 2
        doc.drained = ("GPU-next",)
    assert "ends in a damaged entry" in caplog.text
    [aside] = store.directory.glob("state.journal.corrupt-*")
    assert aside.read_bytes() == whole[len(store.journal_path.read_bytes()) - len(whole):] or aside.read_bytes()
    assert StateStore(store.directory).load().drained == ("GPU-next",)


def test_sync_runs_beside_commits_in_other_threads(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "state", snapshot_every=7)
    commit(store, populated_doc())
    stop = threading.Event()
    errors: list[BaseException] = []

    def syncer() -> None:
        try:
            while not stop.is_set():
                store.sync()
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=syncer)
    thread.start()
    try:
        for n in range(50):
            with store.transaction(sync=False) as doc:
                doc.drained = (f"GPU-{n}",)
    finally:
        stop.set()
        thread.join()
    assert errors == []
    store.sync()
    assert store.durable_generation == 51 == StateStore(store.directory).load().generation


def test_a_failed_fsync_refuses_every_change_after_it(journaled: StateStore,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """After a failed fsync the page cache may be clean and wrong: no retry may pretend otherwise."""
    store = journaled
    commit(store, populated_doc())
    with store.transaction(sync=False) as doc:
        doc.drained = ()
    real = os.fsync

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(StateError, match=r"could not make the state .* durable: Input/output error"):
        store.sync()
    monkeypatch.setattr(os, "fsync", real)
    assert store.durable_generation == 1
    with pytest.raises(StateError, match="restart cgd"):
        store.sync()
    with pytest.raises(StateError, match="restart cgd"), store.transaction() as doc:
        doc.drained = ("GPU-x",)
    fresh = StateStore(store.directory)
    with fresh.transaction() as doc:
        assert doc.generation == 2
    assert fresh.durable_generation == 2


def test_sync_inside_a_transaction_is_refused_not_a_deadlock(journaled: StateStore) -> None:
    with pytest.raises(StateError, match="inside a transaction"), journaled.transaction(sync=False):
        journaled.sync()


def test_a_state_read_from_disk_is_made_durable_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = StateStore(tmp_path / "state")
    commit(writer, populated_doc())
    reader = StateStore(tmp_path / "state")
    assert reader.durable_generation == -1
    calls = _fsyncs(monkeypatch)
    with reader.transaction(sync=False) as doc:
        doc.drained = ()
    assert calls == ["file", "dir"] and reader.durable_generation == 1  # the journal (no snapshot yet), its directory
    with reader.transaction(sync=False) as doc:
        doc.drained = ("GPU-y",)
    assert calls == ["file", "dir"]


def _no_space_for(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes to the file called `name` fail as on a full disk; every other write goes through."""
    real = os.write

    def write(fd: int, data: Any) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/" + name):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize("failing", ["state.journal", "state.json.tmp"])
def test_a_failed_commit_after_an_unsynced_one_does_not_let_sync_skip_its_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    """The failed commit closes the journal; the unsynced entry before it must still be fsync'd
    before `sync()` calls it durable."""
    store = StateStore(tmp_path / "state", snapshot_every=3)
    commit(store, populated_doc())
    with store.transaction(sync=False) as doc:
        doc.drained = ("GPU-unsynced",)
    assert store.durable_generation == 1
    calls = _fsyncs(monkeypatch)
    _no_space_for(failing, monkeypatch)
    with pytest.raises(StateError, match="could not commit generation 3"), store.transaction(sync=False) as doc:
        doc.drained = ("GPU-refused",)
    store.sync(2)
    assert "file" in calls, "generation 2 was declared durable without an fsync"
    assert store.durable_generation == 2
    loaded = StateStore(store.directory).load()
    assert (loaded.generation, loaded.drained) == (2, ("GPU-unsynced",))


def test_closing_the_store_makes_what_it_wrote_durable(journaled: StateStore,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    store = journaled
    commit(store, populated_doc())
    with store.transaction(sync=False) as doc:
        doc.drained = ()
    calls = _fsyncs(monkeypatch)
    store.close()
    store.sync()
    assert calls == ["file"] and store.durable_generation == 2
