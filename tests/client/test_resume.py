"""Where a follower of cgd's events picks up after cgd went away, and how long it waits first."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from computegroups.daemon.client.errors import CgdNotRunning, CgdUnreachable
from computegroups.daemon.client.resume import BACKOFF_S, Resume


def test_a_cgd_that_never_answered_is_raised_not_waited_for() -> None:
    resume = Resume(None)
    with pytest.raises(CgdNotRunning):
        resume.retry(CgdNotRunning("/run/cgd.sock"))


def test_it_reads_on_after_the_last_event_given_and_a_gap_does_not_move_it() -> None:
    resume = Resume(5)
    resume.opened()
    resume.seen({"seq": 7, "type": "allocated"})
    resume.seen({"seq": None, "type": "gap", "after": 7, "next": 2_000_000_001})
    assert resume.since == 7


def test_one_note_per_outage_and_each_outage_starts_with_the_shortest_wait() -> None:
    notes: list[str] = []
    resume = Resume(None, notes.append)
    resume.opened()
    assert resume.retry(None) == BACKOFF_S[0]
    assert resume.retry(CgdNotRunning("/run/cgd.sock")) == BACKOFF_S[1]
    assert notes == ["cgd's events ended; reconnecting to read from the start"]
    resume.opened()
    resume.seen({"seq": 2_000_000_003})
    assert resume.retry(CgdUnreachable("/run/cgd.sock", "broken answer")) == BACKOFF_S[0]
    assert notes[1:] == ["cgd's events broke off; reconnecting to read after 2000000003"]


@given(st.integers(min_value=1, max_value=200))
def test_the_waits_grow_to_a_bound(tries: int) -> None:
    resume = Resume(None)
    resume.opened()
    waits = [resume.retry(CgdNotRunning("/run/cgd.sock", stale=True)) for _ in range(tries)]
    assert waits == sorted(waits) and max(waits) <= BACKOFF_S[-1] and waits[0] == BACKOFF_S[0]
