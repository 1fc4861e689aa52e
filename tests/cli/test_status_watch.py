"""What `cgctl top` puts on a screen of a given size, and what its keys do, without a terminal."""

from __future__ import annotations

import curses

from hypothesis import given
from hypothesis import strategies as st

from computegroups.cli.render import styler
from computegroups.cli.status_long import long_lines
from computegroups.cli.status_view import Board, island_lines
from computegroups.cli.watch import View, frame, highlights, press
from tests.cli.samples import busy_machine, wide_machine

ENTER = 10
plain = styler(False)


def wide() -> tuple[Board, list[list[int]]]:
    status, components, islands = wide_machine()
    return Board.of(status, components, []), islands


def test_eight_gpus_fit_one_line_each() -> None:
    shown = frame(Board.of(*busy_machine()), [list(range(8))], View(), 80, 40, "cgctl top")
    assert not shown.islands and shown.selected is None
    assert shown.lines[0] == "cgctl top  q: quit"
    assert shown.lines[1].startswith("GPU MODEL") and [line.split()[0] for line in shown.lines[2:10]] == [
        str(i) for i in range(8)]


def test_seventy_two_gpus_fold_into_islands_with_the_cursor_on_the_first() -> None:
    board, islands = wide()
    shown = frame(board, islands, View(), 80, 40, "cgctl top")
    assert shown.islands and len(shown.lines) <= 40
    assert "enter: open" in shown.lines[0]
    island_rows = [line for line in shown.lines if line.startswith(("+ ", "- "))]
    assert len(island_rows) == 9 and island_rows[0].startswith("+   0-7 H100 80GB   6% [=-------] 40.0/80.0G  50C")
    assert island_rows[0].endswith("job-0:run") and island_rows[8].split()[1] == "64-71"
    assert shown.lines[shown.selected or 0] == island_rows[0]


def test_keys_move_the_cursor_and_open_an_island() -> None:
    board, islands = wide()
    view = View()
    assert press(curses.KEY_DOWN, view, islands, True, 38) and press(ord("j"), view, islands, True, 38)
    assert press(ENTER, view, islands, True, 38) and view.expanded == {2}
    shown = frame(board, islands, view, 80, 40, "cgctl top")
    selected = shown.lines[shown.selected or 0]
    assert selected.startswith("- 16-23")
    below = shown.lines[(shown.selected or 0) + 1:(shown.selected or 0) + 9]
    assert [line.split()[0] for line in below] == [str(i) for i in range(16, 24)]
    assert press(curses.KEY_LEFT, view, islands, True, 38) and view.expanded == set()
    assert press(ord("e"), view, islands, True, 38) and view.expanded == set(range(9))
    assert press(ord("e"), view, islands, True, 38) and view.expanded == set()
    assert not press(ord("q"), view, islands, True, 38)


def test_the_cursor_stays_on_screen_when_everything_is_open() -> None:
    board, islands = wide()
    view = View(expanded=set(range(9)))
    press(curses.KEY_END, view, islands, True, 18)
    shown = frame(board, islands, view, 80, 20, "cgctl top")
    assert view.cursor == 8 and shown.lines[shown.selected or 0].startswith("- 64-71")
    assert "/" in shown.lines[0].split("  ")[1]  # `first-last/total` of the rows
    press(curses.KEY_HOME, view, islands, True, 18)
    shown = frame(board, islands, view, 80, 20, "cgctl top")
    assert shown.selected == 2 and view.offset == 0


def test_one_island_taller_than_the_screen_scrolls() -> None:
    board, _ = wide()
    view = View()
    first = frame(board, [list(range(72))], view, 80, 20, "t")
    assert not first.islands and first.lines[0] == "t  1-18/74  arrows: scroll  q: quit"
    press(curses.KEY_NPAGE, view, [list(range(72))], False, 18)
    assert frame(board, [list(range(72))], view, 80, 20, "t").lines[2].split()[0] == "18"
    press(curses.KEY_END, view, [list(range(72))], False, 18)
    last = frame(board, [list(range(72))], view, 80, 20, "t")
    assert view.offset == 74 - 18 and last.lines[0].startswith("t  57-74/74")
    assert last.lines[1].startswith("GPU MODEL")  # the column heads stay


def test_the_long_blocks_scroll_under_the_title_alone() -> None:
    board = Board.of(*busy_machine())
    view = View()
    shown = frame(board, [list(range(8))], view, 60, 20, "t", long=True)
    whole = long_lines(board, plain, 60)
    assert not shown.islands and shown.selected is None
    assert shown.lines == [f"t  1-19/{len(whole)}  arrows: scroll  q: quit", *whole[:19]]
    press(curses.KEY_END, view, [list(range(8))], False, 19)
    assert frame(board, [list(range(8))], view, 60, 20, "t", long=True).lines[1:] == whole[-19:]
    assert highlights("  on it: ada/web:run (exclusive), ada/web-sb:shadow") == [(9, 11, 4), (34, 17, 3)]
    assert highlights("  on it: bob/crash:restarting, x:run") == [(9, 20, 2), (31, 5, 4)]


@given(st.integers(min_value=1, max_value=130), st.integers(min_value=2, max_value=80),
       st.sets(st.integers(min_value=0, max_value=8)), st.integers(min_value=-3, max_value=12), st.booleans())
def test_a_frame_never_outgrows_the_screen(width: int, height: int, expanded: set[int], cursor: int,
                                           long: bool) -> None:
    board, islands = wide()
    view = View(expanded=expanded, cursor=cursor)
    shown = frame(board, islands, view, width, height, "cgctl top  every 1s  12:00:00", long)
    assert len(shown.lines) <= height and all(len(line) <= width for line in shown.lines)
    assert shown.selected is None or 0 < shown.selected < len(shown.lines)


def test_states_and_marks_get_their_colours_and_nothing_else() -> None:
    line = "  0 H100 80GB  87% [#####===] 48.0/79.6G  61C  ada/web:run ada/web-sb:shadow crash:restarting"
    assert highlights(line) == [(47, 11, 4), (59, 17, 3), (77, 16, 2)]
    assert highlights("  6 H100 80GB    - [--------]     -/0.0G  40C  FAILED DRAINED job:failed") == [
        (47, 6, 1), (54, 7, 2), (62, 10, 1)]
    assert highlights("GPU MODEL     UTIL MEMORY used/claimed   TEMP  ON IT") == []
    assert highlights("  restarting  crash  bob    3 restarts") == []  # the queue's words are not tokens
    assert highlights("+  8-15 RTX A6000  0% [--------]  0.0/0.0G  35C  x:-") == []


def synthetic() -> tuple[Board, list[list[int]]]:
    """Like synthetic-72: islands of eight, then eight GPUs without NVLink, an island each."""
    status, components, islands = wide_machine()
    return Board.of(status, components, []), [*islands[:8], *([i] for i in islands[8])]


def test_a_one_gpu_island_is_one_line_folded_or_open() -> None:
    board, islands = synthetic()
    for expanded in (set(), set(range(len(islands)))):
        tagged = island_lines(board, islands, expanded, 80, plain)
        singles = [text for n, text in tagged if n is not None and n >= 8]
        assert [text.split()[0] for text in singles] == [str(i) for i in range(64, 72)]
        assert singles[-1].startswith("     71 H100 80GB")  # nothing to open: no + or -
    before = frame(board, islands, View(cursor=8), 80, 40, "t").lines
    view = View(cursor=8)
    press(ENTER, view, islands, True, 38)
    assert frame(board, islands, view, 80, 40, "t").lines[1:] == before[1:]  # Enter on it opens nothing


def test_with_every_island_open_the_end_shows_the_last_gpu_and_the_summary() -> None:
    board, islands = synthetic()
    view = View()
    for key in (ord("e"), curses.KEY_END):
        press(key, view, islands, True, 38)
    shown = frame(board, islands, view, 80, 40, "t")
    total = int(shown.lines[0].split()[1].split("/")[1])
    assert shown.lines[0].split()[1] == f"{total - 37}-{total}/{total}"
    assert shown.lines[-1].startswith("9/72 GPUs used | 9 run")
    assert shown.lines[-3].split()[0] == "71" and view.cursor == len(islands) - 1
    assert shown.selected is not None and shown.lines[shown.selected].split()[0] == "71"
    # j and PgDn from the last island reach the end too, a row or a page at a time
    view = View(expanded=set(range(len(islands))))
    press(curses.KEY_END, view, islands, True, 38)
    frame(board, islands, view, 80, 40, "t")
    view.offset = 0
    view.cursor = len(islands) - 1
    steps = 0
    while not frame(board, islands, view, 80, 40, "t").lines[-1].startswith("9/72 GPUs used"):
        press(ord("j"), view, islands, True, 38)
        steps += 1
        assert steps < 100
    press(curses.KEY_UP, view, islands, True, 38)  # and back up: the cursor is in sight again
    shown = frame(board, islands, view, 80, 40, "t")
    assert shown.selected is not None and shown.lines[shown.selected].split()[0] == "70"
