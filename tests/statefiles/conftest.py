"""A store in a fresh temporary directory for each test."""

from __future__ import annotations

from pathlib import Path

import pytest

from computegroups.statefiles import StateStore


@pytest.fixture
def store(tmp_path: Path) -> StateStore:
    """A snapshot with every commit, as the tests of the snapshot file and its backup want."""
    return StateStore(tmp_path / "state", lock_timeout=2.0, snapshot_every=1)


@pytest.fixture
def journaled(tmp_path: Path) -> StateStore:
    """The daemon's store: commits go to the journal, snapshots are rare."""
    return StateStore(tmp_path / "state", lock_timeout=2.0)
