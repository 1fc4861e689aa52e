"""A store in a fresh temporary directory for each test."""

from __future__ import annotations

from pathlib import Path

import pytest

from computegroups.statefiles import StateStore


@pytest.fixture
def store(tmp_path: Path) -> StateStore:
    return StateStore(tmp_path / "state", lock_timeout=2.0)
