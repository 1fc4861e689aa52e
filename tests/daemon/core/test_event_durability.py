"""A commit's events reach followers only once the commit is durable, and a subscriber's fault
never makes a committed change look failed."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from computegroups.daemon.core.eventlog import Event, visible_to
from computegroups.daemon.core.keeper import StateKeeper
from computegroups.daemon.core.transactions import Caller, new_component_records
from computegroups.daemon.model.claims import Claim
from computegroups.daemon.model.config import DaemonConfig
from computegroups.daemon.model.requests import ComponentRequest
from computegroups.statefiles.store import StateStore
from computegroups.topology import load_machine

ROOT = Caller(pid=1, uid=0, gid=0)
EVERYONE = visible_to(0, is_root=True)


def keeper(state: Path) -> StateKeeper:
    return StateKeeper(load_machine("dgx-h100"), StateStore(state), DaemonConfig())


def allocate(k: StateKeeper, name: str) -> None:
    with k.transaction() as doc:
        new_component_records(doc, k, ComponentRequest(name=name, claim=Claim(gpus=1)), ROOT)


def types(events: list[Event]) -> list[str]:
    return [e["type"] for e in events]


def test_a_follower_gets_an_allocation_only_once_its_fsync_has_ended(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    k = keeper(tmp_path)
    allocate(k, "warm")  # the journal exists: the next commit's only fsync is the group commit's
    counted: list[str] = []
    k.events.subscribe(lambda e: counted.append(e["type"]))
    gate, syncing = threading.Event(), threading.Event()
    real = os.fsync

    def slow_fsync(fd: int) -> None:
        syncing.set()
        assert gate.wait(30), "the test never let the fsync end"
        real(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)

    async def scenario() -> None:
        seen = k.events.last_seq
        follower = asyncio.ensure_future(k.events.wait(seen, timeout=30))
        allocate(k, "a")
        assert counted == ["allocated"], "counters count at commit"
        await asyncio.to_thread(syncing.wait, 30)
        for _ in range(20):
            await asyncio.sleep(0)
        assert k.store.durable_generation < k.doc.generation, "the fsync is still in flight"
        assert k.events.after(seen, EVERYONE) == ([], None), "nothing told before it is durable"
        assert k.events.last_seq == seen and not follower.done()
        gate.set()
        await asyncio.wait_for(follower, 10)
        found, _ = k.events.after(seen, EVERYONE)
        assert types(found) == ["allocated"] and found[0]["seq"] == seen + 1
        assert k.store.durable_generation >= k.doc.generation

    asyncio.run(scenario())


def test_an_event_without_a_commit_waits_behind_held_ones_to_keep_the_order(tmp_path: Path) -> None:
    log = keeper(tmp_path).events
    log.emit("allocated", "a", uid=None, generation=7)
    log.emit("worker_exited", "b", uid=None)
    assert log.after(None, EVERYONE)[0] == []
    log.release(6)
    assert log.after(None, EVERYONE)[0] == []
    log.release(7)
    assert [e["message"] for e in log.after(None, EVERYONE)[0]] == ["a", "b"]


def test_after_a_failed_fsync_held_commit_events_are_never_told_and_the_rest_go_out(tmp_path: Path) -> None:
    log = keeper(tmp_path).events
    log.emit("allocated", "a", uid=None, generation=7)
    log.emit("worker_exited", "b", uid=None)
    log.emit("released", "c", uid=None, generation=8)
    assert log.drop_held() == 2
    assert [e["message"] for e in log.after(None, EVERYONE)[0]] == ["b"]
    log.release(8)
    assert [e["message"] for e in log.after(None, EVERYONE)[0]] == ["b"], "dropped for good"
    log.emit("worker_exited", "d", uid=None)
    assert [e["message"] for e in log.after(None, EVERYONE)[0]] == ["b", "d"], "nothing waits behind them"


def test_a_failing_subscriber_leaves_the_commit_made_told_and_its_waiters_woken(tmp_path: Path) -> None:
    k = keeper(tmp_path)

    def broken(event: Event) -> None:
        raise RuntimeError("subscriber bug")

    k.events.subscribe(broken)
    woken: list[bool] = []

    async def scenario() -> None:
        waiter = asyncio.ensure_future(k.changed(timeout=30))
        await asyncio.sleep(0)
        allocate(k, "a")  # raised, and left the change half told, before subscribers were isolated
        await k.durable()
        await asyncio.wait_for(waiter, 10)
        woken.append(True)

    asyncio.run(scenario())
    assert woken and "a" in k.doc.components
    assert types(k.events.after(None, EVERYONE)[0]) == ["allocated"]
    assert k.store.durable_generation == k.doc.generation
    allocate(k, "b")
    assert types(k.events.after(None, EVERYONE)[0]) == ["allocated", "allocated"]
