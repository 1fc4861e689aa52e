"""Which socket a client picks when it is not told."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from computegroups.daemon.client import locate


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    own, system_socket = tmp_path / "user" / "cgd.sock", tmp_path / "system" / "cgd.sock"

    def socket_path(explicit=None, system=None):
        chosen = explicit or os.environ.get("CG_SOCKET")
        if chosen:
            return Path(chosen)
        return system_socket if system else own

    monkeypatch.setattr(locate, "socket_path", socket_path)
    monkeypatch.delenv("CG_SOCKET", raising=False)
    for p in (own, system_socket):
        p.parent.mkdir()
    return own, system_socket


def test_a_user_without_a_cgd_of_their_own_finds_the_system_one(places: tuple[Path, Path]) -> None:
    own, system = places
    assert locate.client_socket_path() == own  # neither runs: the error names the user's own
    system.touch()
    assert locate.client_socket_path() == system
    own.touch()
    assert locate.client_socket_path() == own
    assert locate.client_socket_path("/x/cgd.sock") == Path("/x/cgd.sock")


def test_cg_socket_wins(places: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    _, system = places
    system.touch()
    monkeypatch.setenv("CG_SOCKET", "/elsewhere.sock")
    assert locate.client_socket_path() == Path("/elsewhere.sock")
