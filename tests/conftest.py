"""Shared fixtures: a real cgd on a simulated machine."""

from __future__ import annotations

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
