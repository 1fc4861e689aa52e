"""The event ring: numbering across restarts, what a reconnecting client is told, who sees what."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from computegroups.daemon.core.eventlog import EPOCH_SPAN, EventLog, next_epoch, visible_to
from computegroups.daemon.model.errors import BadRequest

EVERYONE = visible_to(0, is_root=True)


def test_epochs_count_up_once_per_start(tmp_path: Path) -> None:
    assert [next_epoch(tmp_path) for _ in range(3)] == [1, 2, 3]
    assert (tmp_path / "events.epoch").read_text() == "3\n"
    (tmp_path / "events.epoch").write_text("garbage")
    assert next_epoch(tmp_path) == 1


def test_numbers_grow_within_and_across_runs() -> None:
    first, second = EventLog(epoch=1), EventLog(epoch=2)
    a = [first.emit("allocated", "a", uid=1)["seq"] for _ in range(3)]
    b = second.emit("allocated", "b", uid=1)["seq"]
    assert a == [EPOCH_SPAN + 1, EPOCH_SPAN + 2, EPOCH_SPAN + 3] and b == 2 * EPOCH_SPAN + 1


def test_since_gives_what_followed_and_a_gap_when_some_are_gone() -> None:
    log = EventLog(epoch=1, keep=3)
    seqs = [log.emit("worker_started", str(i), uid=None)["seq"] for i in range(5)]
    found, gap = log.after(seqs[2], EVERYONE)
    assert [e["seq"] for e in found] == seqs[3:] and gap is None
    found, gap = log.after(seqs[0], EVERYONE)
    assert [e["seq"] for e in found] == seqs[2:], "the kept ones"
    assert gap is not None and gap["type"] == "gap" and gap["after"] == seqs[0] and gap["next"] == seqs[2]
    assert "no longer kept" in gap["message"]
    found, gap = log.after(None, EVERYONE)
    assert [e["seq"] for e in found] == seqs[2:] and gap is None
    found, gap = log.after(seqs[-1], EVERYONE)
    assert found == [] and gap is None


def test_a_number_of_an_earlier_run_or_of_no_run_is_a_gap() -> None:
    log = EventLog(epoch=2)
    _, gap = log.after(EPOCH_SPAN + 40, EVERYONE)
    assert gap is not None
    assert gap["message"] == "missed events: cgd restarted since: the events of its earlier run are gone"
    log.emit("allocated", "a", uid=None)
    found, gap = log.after(5 * EPOCH_SPAN, EVERYONE)
    assert gap is not None and "started again" in gap["message"] and [e["message"] for e in found] == ["a"]
    assert gap["after"] == 5 * EPOCH_SPAN, "the since given"


def test_the_gap_says_why_and_a_number_no_run_gave_is_refused() -> None:
    log = EventLog(epoch=3, keep=2)
    seqs = [log.emit("allocated", str(i), uid=None)["seq"] for i in range(4)]
    _, gap = log.after(seqs[0], EVERYONE)
    assert gap is not None and gap["message"] == "missed events: older events are no longer kept (the last 2)"
    for seq in (seqs[-1], 3 * EPOCH_SPAN, 0, None):
        log.check_since(seq)
    found, gap = log.after(0, EVERYONE)
    assert [e["seq"] for e in found] == seqs[2:] and gap is None, "0: from the start"
    with pytest.raises(BadRequest, match=rf"since: {seqs[-1] + 1} is after the last event of this run \({seqs[-1]}\)"):
        log.check_since(seqs[-1] + 1)
    with pytest.raises(BadRequest, match="since: 5 is no event number of cgd"):
        log.check_since(5)
    log.check_since(4 * EPOCH_SPAN + 7)  # a later run's: the numbers started again, told by a gap


def test_users_see_their_own_and_the_machines_events() -> None:
    log = EventLog()
    log.emit("allocated", "mine", uid=1000)
    log.emit("allocated", "theirs", uid=1001)
    log.emit("drained", "machine", uid=None)
    assert [e["message"] for e in log.after(None, visible_to(1000, is_root=False))[0]] == ["mine", "machine"]
    assert len(log.after(None, visible_to(0, is_root=True))[0]) == 3


def test_a_waiter_wakes_at_the_next_event_and_subscribers_see_each() -> None:
    log = EventLog()
    seen: list[str] = []
    log.subscribe(lambda e: seen.append(e["type"]))

    async def scenario() -> None:
        waiting = asyncio.ensure_future(log.wait(log.last_seq, timeout=30))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not waiting.done(), "no event yet: the waiter waits"
        log.emit("queued", "q", uid=None)
        await asyncio.wait_for(waiting, 5)  # within 5 s, not at its 30 s timeout

    asyncio.run(scenario())
    assert seen == ["queued"]


def test_a_follower_reads_only_what_came_after_its_number_in_a_full_ring() -> None:
    log = EventLog(epoch=1, keep=50)
    seqs = [log.emit("worker_started", str(i), uid=None)["seq"] for i in range(120)]
    for since in (seqs[70], seqs[-2], seqs[-1], seqs[100]):
        found, gap = log.after(since, EVERYONE)
        assert [e["seq"] for e in found] == [s for s in seqs if s > since] and gap is None


def test_a_held_events_owner_is_looked_up_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    from computegroups.daemon.core import eventlog

    where: list[str] = []

    def lookup(uid: int) -> str:
        where.append(threading.current_thread().name)
        return f"user{uid}"

    monkeypatch.setattr(eventlog, "_lookup", lookup)
    log = EventLog()
    log.emit("allocated", "a", uid=1234, generation=3)
    worker = threading.Thread(target=log.learn_names, name="fsync")
    worker.start()
    worker.join()
    log.release(3)
    log.emit("allocated", "b", uid=1234)
    assert [e["user"] for e in log.after(None, EVERYONE)[0]] == ["user1234", "user1234"]
    assert where == ["fsync"], "once, and not on the loop's thread"


@pytest.mark.parametrize("name", ["events.epoch", "events.epoch.tmp"])
def test_the_epoch_is_never_written_through_a_planted_link(tmp_path: Path, name: str) -> None:
    """cgd (often root) writes the epoch beside the state: a link planted there is replaced, not followed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("PRECIOUS")
    state = tmp_path / "state"
    state.mkdir()
    (state / name).symlink_to(victim)
    assert next_epoch(state) == 1
    assert victim.read_text() == "PRECIOUS" and sorted(p.name for p in outside.iterdir()) == ["victim"]
    epoch = state / "events.epoch"
    assert not epoch.is_symlink() and epoch.read_text() == "1\n" and epoch.stat().st_mode & 0o777 == 0o600
    assert not (state / "events.epoch.tmp").exists()
