"""Where the state directory is, in each mode and with each override."""

from __future__ import annotations

from pathlib import Path

import pytest

from computegroups.statefiles import default_state_dir, resolve_state_dir


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CG_STATE_DIR", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def test_system_mode() -> None:
    assert default_state_dir(system=True) == Path("/var/lib/computegroups")


def test_user_mode_default(tmp_path: Path) -> None:
    assert default_state_dir(system=False) == tmp_path / "home" / ".local" / "state" / "computegroups"


def test_user_mode_honours_xdg_state_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir(system=False) == tmp_path / "xdg" / "computegroups"
    assert default_state_dir(system=True) == Path("/var/lib/computegroups")


def test_a_relative_xdg_state_home_is_ignored(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")
    assert default_state_dir(system=False) == tmp_path / "home" / ".local" / "state" / "computegroups"


def test_cg_state_dir_overrides_both_modes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CG_STATE_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_state_dir(system=False) == tmp_path / "mine"
    assert default_state_dir(system=True) == tmp_path / "mine"


def test_the_mode_follows_the_effective_uid(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 0)
    assert default_state_dir() == Path("/var/lib/computegroups")
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert default_state_dir() == tmp_path / "home" / ".local" / "state" / "computegroups"


def test_an_explicit_directory_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CG_STATE_DIR", str(tmp_path / "env"))
    assert resolve_state_dir(tmp_path / "flag") == tmp_path / "flag"
    assert resolve_state_dir(None) == tmp_path / "env"
