"""The manager in process, without workers: its background handlers, and what it acts on after waiting for the lock."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

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


def test_deallocating_a_group_acts_on_the_group_it_looked_at(tmp_path) -> None:
    """A group deleted and another made with its id while the deallocation waited is not the one deleted."""
    from msgspec.structs import replace

    from computegroups.daemon.core.keeper import StateKeeper
    from computegroups.daemon.core.transactions import Caller
    from computegroups.daemon.model.claims import Claim
    from computegroups.daemon.model.config import DaemonConfig
    from computegroups.statefiles.store import StateStore
    from computegroups.topology import load_machine

    keeper = StateKeeper(load_machine("dgx-h100"), StateStore(tmp_path), DaemonConfig())
    manager = Manager(keeper, None, None)  # type: ignore[arg-type]  # no worker is involved
    alice = Caller(pid=1, uid=1000, gid=1000)

    async def remade(seen) -> None:
        async with keeper.lock:
            with keeper.transaction() as doc:
                doc.groups.pop(seen.id, None)
                doc.groups[seen.id] = replace(seen, created=seen.created + 1)

    async def main() -> tuple[dict, Any]:
        await manager.create_group(alice, Claim(gpus=1))
        (seen,) = keeper.doc.groups.values()
        await keeper.lock.acquire()  # someone else's operation holds the lock
        deallocating = asyncio.ensure_future(manager.deallocate_group(alice, seen.id))
        await asyncio.sleep(0)
        remaking = asyncio.ensure_future(remade(seen))
        await asyncio.sleep(0)
        keeper.lock.release()
        await remaking
        return await deallocating, seen

    done, seen = asyncio.run(main())
    assert done["action"] == "deleted"
    (left,) = keeper.doc.groups.values()
    assert left.created == seen.created + 1, "the group made after the deallocation looked survives"
