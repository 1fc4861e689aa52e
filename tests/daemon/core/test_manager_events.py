"""The manager's background event handlers: a failure in one is logged, not lost."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

from computegroups.daemon.core.manager import Manager


def test_a_failing_event_handler_is_logged_at_once(caplog: pytest.LogCaptureFixture) -> None:
    manager = Manager(SimpleNamespace(config=None), None, None)  # type: ignore[arg-type]

    async def broken() -> None:
        raise RuntimeError("state file vanished")

    async def fine() -> None:
        return None

    async def main() -> None:
        manager._spawn(broken())
        manager._spawn(fine())
        await asyncio.sleep(0.01)

    with caplog.at_level(logging.ERROR, logger="cgd.manager"):
        asyncio.run(main())
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == ["handling a worker event failed: state file vanished"]
    assert errors[0].exc_info is not None and errors[0].exc_info[0] is RuntimeError
    assert not manager._tasks
