"""What `allocate --detach` and `allocate --wait` say about a queued claim."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from computegroups.cli.wait import queued_lines
from tests.cli.samples import IN_THE_WAY


def test_a_long_reason_is_wrapped_not_left_past_the_edge() -> None:
    queued = {"name": "eval2", "queue": {"position": 1, "reason": IN_THE_WAY}}
    lines = queued_lines(queued, 80)
    assert lines[0].startswith("queued eval2: position 1 (needs 8 whole GPUs; 0 free")
    assert len(lines) > 2 and all(len(line) <= 80 for line in lines)
    assert all(line.startswith("  ") for line in lines[1:])
    assert " ".join(line.strip() for line in lines) == f"queued eval2: position 1 ({IN_THE_WAY})"
    waiting = queued_lines(queued, 80, "; waiting (^C gives up)")
    assert " ".join(waiting).endswith("GPUs 5,6)); waiting (^C gives up)")


def test_a_short_reason_stays_on_one_line() -> None:
    assert queued_lines({"name": "b", "queue": {"position": 2, "reason": "needs 1 GPU"}}, 80) == [
        "queued b: position 2 (needs 1 GPU)"]
    assert queued_lines({"name": "b", "queue": None}, 80) == ["queued b: position ? (waiting for capacity)"]


@given(st.integers(min_value=1, max_value=120))
def test_never_wider_than_the_terminal(width: int) -> None:
    lines = queued_lines({"name": "x" * 40, "queue": {"position": 1, "reason": IN_THE_WAY}}, width)
    assert all(len(line) <= width for line in lines)
