"""Commits left to a later `sync()`: visible at once, durable when sync returns, never a worse backup."""

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
        store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    commit(store, populated_doc())
    assert store.durable_generation == 1
    calls = _fsyncs(monkeypatch)
    with (txn := store.transaction(sync=False)) as doc:
        doc.drained = ()
    assert txn.written and calls == []
    assert StateStore(store.directory).load().generation == 2
    assert store.durable_generation == 1
    store.sync(2)
    assert calls == ["file", "dir"] and store.durable_generation == 2
    store.sync(2)
    assert calls == ["file", "dir"], "a generation already durable costs nothing"


def test_one_sync_covers_every_commit_before_it(store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    commit(store, populated_doc())
    calls = _fsyncs(monkeypatch)
    for n in range(5):
        with store.transaction(sync=False) as doc:
            doc.drained = (f"GPU-{n}",)
    store.sync()
    assert calls == ["file", "dir"]
    assert store.durable_generation == 6


def test_the_backup_is_only_ever_a_durable_generation(store: StateStore) -> None:
    """A power cut may tear files written since the last sync; the backup must not be one of them."""
    commit(store, populated_doc())
    durable = store.path.read_bytes()
    for n in range(3):
        with store.transaction(sync=False) as doc:
            doc.drained = (f"GPU-{n}",)
    assert store.backup_path.read_bytes() == durable
    store.sync()
    with store.transaction(sync=False) as doc:
        doc.drained = ()
    assert StateStore(store.directory).load().generation == 5
    backup = StateStore(store.directory)
    backup.path = store.backup_path
    assert backup.load().generation == 4


def test_a_torn_unsynced_file_falls_back_to_at_least_the_last_synced_generation(store: StateStore) -> None:
    commit(store, populated_doc())
    with store.transaction(sync=False) as doc:
        doc.drained = ("GPU-synced",)
    store.sync()
    for n in range(2):
        with store.transaction(sync=False) as doc:
            doc.drained = (f"GPU-{n}",)
    store.path.write_bytes(store.path.read_bytes()[:100])  # what a power cut can leave of an unsynced file
    loaded = StateStore(store.directory).load()
    assert (loaded.generation, loaded.drained) == (2, ("GPU-synced",))


def test_sync_runs_beside_commits_in_other_threads(store: StateStore) -> None:
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


def test_a_failed_fsync_refuses_every_change_after_it(store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a failed fsync the page cache may be clean and wrong: no retry may pretend otherwise."""
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


def test_sync_inside_a_transaction_is_refused_not_a_deadlock(store: StateStore) -> None:
    with pytest.raises(StateError, match="inside a transaction"), store.transaction(sync=False):
        store.sync()


def test_a_state_read_from_disk_is_made_durable_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writer = StateStore(tmp_path / "state")
    commit(writer, populated_doc())
    reader = StateStore(tmp_path / "state")
    assert reader.durable_generation == -1
    calls = _fsyncs(monkeypatch)
    with reader.transaction(sync=False) as doc:
        doc.drained = ()
    assert calls == ["file", "dir"] and reader.durable_generation == 1
    with reader.transaction(sync=False) as doc:
        doc.drained = ("GPU-y",)
    assert calls == ["file", "dir"]


def test_sync_of_a_state_that_is_gone_is_refused(store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    commit(store, populated_doc())
    with store.transaction(sync=False) as doc:
        doc.drained = ()
    real_open = os.open

    def gone(path: Any, *args: Any) -> int:
        if Path(path) == store.path:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(path))
        return real_open(path, *args)

    monkeypatch.setattr(os, "open", gone)
    with pytest.raises(StateError, match="No such file or directory"):
        store.sync()
