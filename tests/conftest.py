"""Shared fixtures: a real cgd on a simulated machine, and where its sd_notify datagrams go."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.daemon_fixture import Cgd


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", help="run the long reliability suite")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="long form: run with --long")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def start_cgd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Cgd]]:
    """Start one or more daemons; every one is stopped and its workers killed after the test."""
    started: list[Cgd] = []

    def start(machine: str = "dgx-h100", *extra_args: str, root: Path | None = None,
              env: dict[str, str] | None = None) -> Cgd:
        cgd = Cgd(root or tmp_path_factory.mktemp("cgd"), machine, tuple(extra_args), dict(env or {}))
        started.append(cgd)
        return cgd.start()

    yield start
    for cgd in started:
        cgd.cleanup()


@pytest.fixture
def cgd(start_cgd: Callable[..., Cgd]) -> Cgd:
    """A daemon on the simulated dgx-h100."""
    return start_cgd("dgx-h100")


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[socket.socket]:
    """Where cgd's sd_notify datagrams go, as systemd would listen."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.settimeout(10)
    yield sock
    sock.close()
