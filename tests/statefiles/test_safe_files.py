"""cgd writes the state as root: no name planted in the directory may lead a write anywhere else (issue 13).

Each test plants a symbolic link under one name the store writes, pointing
outside the directory (at a file that exists and at one that does not), then
drives the store to write that name. Whether it refuses or goes on, the
outside file is neither created nor changed. And every file it creates is
0600 whatever the umask: component specs may hold secrets.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import computegroups.statefiles.store as store_module
from computegroups.statefiles import StateError, StateStore
from tests.statefiles.samples import commit, populated_doc
from tests.statefiles.test_migrations import RELEASE_0_1_0

PRECIOUS = b"not the state's to touch\n"


def _drained(store: StateStore, *gpus: str) -> None:
    with store.transaction() as doc:
        doc.drained = gpus


def _snapshot(directory: Path) -> Iterator[StateStore]:
    """A first snapshot: `state.json.tmp`, renamed to `state.json`."""
    store = StateStore(directory, snapshot_every=1)
    yield store
    commit(store, populated_doc())


def _second_snapshot(directory: Path) -> Iterator[StateStore]:
    """The snapshot before becomes the backup through `state.json.bak.tmp`; the journal moves aside."""
    store = StateStore(directory, snapshot_every=1)
    commit(store, populated_doc())
    yield store
    _drained(store, "GPU-x")


def _second_snapshot_copied(directory: Path) -> Iterator[StateStore]:
    """Where hard links are refused the backup is copied to `state.json.bak.tmp` instead."""
    real = os.link

    def refused(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    os.link = refused
    try:
        yield from _second_snapshot(directory)
    finally:
        os.link = real


def _journal_append(directory: Path) -> Iterator[StateStore]:
    store = StateStore(directory)
    commit(store, populated_doc())
    yield store
    _drained(store, "GPU-x")


def _new_journal(directory: Path) -> Iterator[StateStore]:
    store = StateStore(directory)
    yield store
    commit(store, populated_doc())


def _upgrade(directory: Path) -> Iterator[StateStore]:
    """The first write after an upgrade keeps the original as `state.json.v1`."""
    directory.mkdir(mode=0o700, parents=True)
    fd = os.open(directory / "state.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # as cgd 0.1.0 wrote it
    with os.fdopen(fd, "wb") as original:
        original.write(RELEASE_0_1_0.read_bytes())
    store = StateStore(directory)
    yield store
    with store.transaction():
        pass


def _torn_journal(directory: Path) -> Iterator[StateStore]:
    """The torn end of the journal is set aside as `state.journal.corrupt-<time>`."""
    store = StateStore(directory)
    commit(store, populated_doc())
    with store.journal_path.open("ab") as journal:
        journal.write(b'{"schema_version": 3, "gener')
    yield StateStore(directory)
    _drained(StateStore(directory), "GPU-x")


def _fallback(directory: Path) -> Iterator[StateStore]:
    """A bad state file is set aside as `state.json.corrupt-<time>` by the next snapshot."""
    store = StateStore(directory, snapshot_every=1)
    commit(store, populated_doc())
    _drained(store, "GPU-y")
    store.path.write_bytes(b"{ not json")
    yield store
    _drained(StateStore(directory, snapshot_every=1), "GPU-x")


def _any_transaction(directory: Path) -> Iterator[StateStore]:
    store = StateStore(directory)
    commit(store, populated_doc())
    yield store
    _drained(store, "GPU-x")


SCENARIOS: dict[str, tuple[str, Callable[[Path], Iterator[StateStore]]]] = {
    "temporary snapshot": ("state.json.tmp", _snapshot),
    "temporary backup": ("state.json.bak.tmp", _second_snapshot),
    "temporary backup, copied": ("state.json.bak.tmp", _second_snapshot_copied),
    "backup": ("state.json.bak", _second_snapshot),
    "backup journal": ("state.journal.bak", _second_snapshot),
    "journal, opened": ("state.journal", _journal_append),
    "journal, created": ("state.journal", _new_journal),
    "original before an upgrade": ("state.json.v1", _upgrade),
    "torn journal end set aside": ("state.journal.corrupt-T", _torn_journal),
    "bad state file set aside": ("state.json.corrupt-T", _fallback),
    "lock": ("state.lock", _any_transaction),
}


@pytest.mark.parametrize("target", ["existing", "missing"])
@pytest.mark.parametrize("scenario", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_a_planted_link_never_leads_a_write_outside_the_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str,
        scenario: tuple[str, Callable[[Path], Iterator[StateStore]]]) -> None:
    monkeypatch.setattr(store_module, "_stamp", lambda: "T")
    name, steps = scenario
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_bytes(PRECIOUS)
    directory = tmp_path / "state"
    run = steps(directory)
    next(run)
    directory.mkdir(exist_ok=True)
    (directory / name).unlink(missing_ok=True)
    (directory / name).symlink_to(victim if target == "existing" else outside / "created")
    try:
        next(run, None)
    except StateError:
        pass  # refusing is fine; writing through the link is not
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert victim.read_bytes() == PRECIOUS


def test_every_file_of_the_state_is_0600_whatever_the_umask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "_stamp", lambda: "T")
    old = os.umask(0)
    try:
        for steps in (_second_snapshot, _second_snapshot_copied, _journal_append, _upgrade, _torn_journal, _fallback):
            directory = tmp_path / steps.__name__
            for _ in steps(directory):
                pass
            modes = {p.name: stat.S_IMODE(p.lstat().st_mode) for p in directory.iterdir()}
            assert {name: mode for name, mode in modes.items() if mode != 0o600} == {}, steps.__name__
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    finally:
        os.umask(old)
