"""`cgctl top` / `cgctl status --watch`: the status redrawn in place, like nvitop or `gpustat -i`.

curses owns the terminal (alternate screen, keys, resizes) and gives it back
as it found it however the loop ends: q, Ctrl-C, and SIGTERM or SIGHUP
(a `kill`, a closed terminal window), which end it as cleanly as q does;
a terminal gone without a signal ends it too. What a frame shows is
the pure `frame()`, tested without a terminal: when one line per GPU does not
fit the screen, one line per NVLink island (the topology cgd serves), which
Enter opens; whatever is still taller than the screen scrolls. No line is
ever longer than the screen is wide, so nothing wraps.
"""

from __future__ import annotations

import curses
import re
import signal
import sys
import termios
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType

from computegroups.cli.render import colour_enabled, state_loss_lines, styler
from computegroups.cli.status_long import long_lines
from computegroups.cli.status_view import Board, clip, island_lines, status_lines, summary_lines, tail_lines
from computegroups.daemon.client.errors import ClientError

plain = styler(False)
KEYS_FLAT = "arrows: scroll  q: quit"
KEYS_ISLANDS = "enter: open  e: all  q: quit"


STATE_KINDS = {"failed": 1, "lost": 1, "timeout": 1, "restarting": 2, "start": 2, "degraded": 2,
               "shadow": 3, "reserved": 3, "run": 4}
MARK_KINDS = {"FAILED": 1, "LOST": 1, "DEGRADED": 1, "DRAINED": 2, "FOREIGN": 2, "OVER-SHARE": 2}
"""Colour pairs: 1 red (broken), 2 yellow (look soon), 3 cyan (standing by), 4 green (working)."""
TOKEN = re.compile(r"(?<=\s)[^\s,]+:([a-z]+)(?=[\s,]|$)|(?<=\s)([A-Z][A-Z-]{3,})(?=\s|:|$)")


def highlights(text: str) -> list[tuple[int, int, int]]:
    """Where `text` (a line of `frame()`) gets a colour: (column, length, pair) for each
    `name:state` whose state has one and each mark in capitals."""
    found = []
    for m in TOKEN.finditer(text):
        pair = STATE_KINDS.get(m.group(1)) if m.group(1) is not None else MARK_KINDS.get(m.group(2))
        if pair:
            found.append((m.start(), m.end() - m.start(), pair))
    return found


@dataclass
class View:
    """Where the person is on the screen: open islands, the island under the cursor, the first row shown."""

    expanded: set[int] = field(default_factory=set)
    cursor: int = 0
    offset: int = 0


@dataclass
class Frame:
    lines: list[str]
    selected: int | None
    """The screen row of the island under the cursor, drawn reversed."""
    islands: bool
    """Whether the GPUs were folded into NVLink islands to fit the screen."""


def frame(board: Board, islands: Sequence[Sequence[int]], view: View, width: int, height: int,
          title: str, long: bool = False) -> Frame:
    """The screen for `board` at `width` x `height`: a title line, the column heads, then as much
    of the rest as fits from `view.offset` on (moved so that the cursor stays in sight). `long`:
    the blocks of `cgctl status --long`, which have no column heads and only scroll."""
    folded = False
    cursor_row = None
    if long:
        heads: list[str] = []
        body = long_lines(board, plain, width)
    else:
        loss = state_loss_lines(board.status.get("state_loss") or [], plain)
        flat = status_lines(board, plain, width)
        folded = len(flat) > height - 1 and len(islands) > 1
        if folded:
            view.cursor = max(0, min(view.cursor, len(islands) - 1))
            tagged = island_lines(board, islands, view.expanded, width, plain)
            heads = [tagged[0][1]]
            cursor_row = len(loss) + next(i for i, (n, _) in enumerate(tagged[1:]) if n == view.cursor)
            body = [*loss, *(text for _, text in tagged[1:]), "", *summary_lines(board, width),
                    *tail_lines(board, width, plain)]
        else:
            heads = [flat[len(loss)]]
            body = [*flat[:len(loss)], *flat[len(loss) + 1:]]
    rows = max(0, height - 1 - len(heads))
    if cursor_row is not None:
        if view.cursor < len(islands) - 1:  # on the last island the rest may scroll its line out of sight
            view.offset = min(view.offset, cursor_row)
        view.offset = max(view.offset, cursor_row - rows + 1)
    view.offset = max(0, min(view.offset, len(body) - rows))
    shown = body[view.offset:view.offset + rows]
    if cursor_row is not None and not view.offset <= cursor_row < view.offset + rows:
        cursor_row = None
    scrolls = len(body) > rows
    keys = KEYS_ISLANDS if folded else KEYS_FLAT if scrolls else "q: quit"
    top = f"{title}  {view.offset + 1}-{view.offset + len(shown)}/{len(body)}" if scrolls else title
    top = f"{top}  {keys}" if len(top) + 2 + len(keys) <= width else top
    lines = [clip(top, width), *(heads if height > 1 else []), *shown][:height]
    return Frame(lines, None if cursor_row is None or rows == 0 else cursor_row - view.offset + 1 + len(heads),
                 folded)


def press(key: int, view: View, islands: Sequence[Sequence[int]], folded: bool, page: int) -> bool:
    """Apply one key to `view`; False when it asks to quit."""
    if key in (ord("q"), ord("Q"), 27):
        return False
    step = {curses.KEY_UP: -1, ord("k"): -1, curses.KEY_DOWN: 1, ord("j"): 1,
            curses.KEY_PPAGE: -page, curses.KEY_NPAGE: page,
            curses.KEY_HOME: -10**6, ord("g"): -10**6, curses.KEY_END: 10**6, ord("G"): 10**6}.get(key)
    if step is not None:
        if folded:
            last = len(islands) - 1
            view.cursor, beyond = max(0, min(last, view.cursor + step)), view.cursor + step - last
            if beyond > 0:  # past the last island: what is under it (its GPUs, the summary) scrolls into sight
                view.offset += beyond
        else:
            view.offset = max(0, view.offset + step)
    elif folded and key in (10, 13, curses.KEY_ENTER, ord(" ")):
        view.expanded ^= {view.cursor}
    elif folded and key == curses.KEY_RIGHT:
        view.expanded.add(view.cursor)
    elif folded and key == curses.KEY_LEFT:
        view.expanded.discard(view.cursor)
    elif key == ord("e"):
        view.expanded = set() if view.expanded else set(range(len(islands)))
    return True


def watch(look: Callable[[], Board], first: Board, islands: Sequence[Sequence[int]], interval: float,
          host: str, long: bool = False) -> None:
    """Redraw until q, Ctrl-C, SIGTERM or SIGHUP (the blocks of `--long` with `long`); a cgd that
    stops answering is said on the title line, the last look kept."""
    asked = Stop()
    before = {signum: signal.signal(signum, asked.set) for signum in STOP_SIGNALS}
    try:
        curses.wrapper(_loop, look, first, islands, interval, host, asked, long)
    except KeyboardInterrupt:
        pass
    except curses.error:
        if not hung_up():
            raise  # with the terminal gone, curses cannot give it back, nor is there one to give back
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def hung_up() -> bool:
    """Whether the terminal has gone (its window closed): its settings can no longer be read.
    A shell tells its jobs with SIGHUP, but one that ignores it (nohup, `sh -c`) does not."""
    try:
        termios.tcgetattr(sys.stdin.fileno())
    except (termios.error, OSError, ValueError):
        return True
    return False


@dataclass
class Stop:
    """Set by SIGTERM or SIGHUP: the loop sees it once the signal has woken its wait for a key,
    and leaves the way q does, so curses gives the terminal back."""

    asked: bool = False

    def set(self, signum: int, frame: FrameType | None) -> None:
        self.asked = True

    def is_set(self) -> bool:
        """Asked by now: a call, as a signal can set it between any two lines of the loop."""
        return self.asked


def _loop(screen: curses.window, look: Callable[[], Board], board: Board, islands: Sequence[Sequence[int]],
          interval: float, host: str, stop: Stop, long: bool) -> None:
    try:
        curses.curs_set(0)
    except curses.error:
        pass  # a terminal that cannot hide the cursor shows it
    curses.set_escdelay(25)  # Esc quits at once rather than after curses' second of waiting for a sequence
    colour = curses.has_colors() and colour_enabled(sys.stdout)
    if colour:
        curses.use_default_colors()
        for pair, fg in ((1, curses.COLOR_RED), (2, curses.COLOR_YELLOW), (3, curses.COLOR_CYAN),
                         (4, curses.COLOR_GREEN)):
            curses.init_pair(pair, fg, -1)
    view = View()
    looked = time.monotonic()
    trouble = ""
    while not stop.is_set():
        height, width = screen.getmaxyx()
        title = f"{host}  every {interval:g}s  {time.strftime('%H:%M:%S')}{trouble}"
        shown = frame(board, islands, view, width, height, title, long)
        _draw(screen, shown, width, colour)
        screen.timeout(max(0, int((looked + interval - time.monotonic()) * 1000)))
        key = screen.getch()
        if stop.is_set() or (key == -1 and hung_up()):  # a gone terminal answers every wait at once
            return
        if key != -1 and not press(key, view, islands, shown.islands, max(1, height - 2)):
            return
        if time.monotonic() >= looked + interval:
            looked = time.monotonic()
            try:
                board, trouble = look(), ""
            except ClientError as err:
                trouble = f"  cgd: {err}"
                board = board._replace(now=time.time())  # the last look's numbers age: shown stale in time


def _draw(screen: curses.window, shown: Frame, width: int, colour: bool) -> None:
    screen.erase()
    for row, text in enumerate(shown.lines):
        attr = curses.A_REVERSE if row == shown.selected else curses.A_BOLD if row == 0 else curses.A_NORMAL
        try:
            screen.addnstr(row, 0, text, width, attr)
            for column, length, pair in highlights(text) if colour and row else ():
                screen.chgat(row, column, length, attr | curses.color_pair(pair))
        except curses.error:
            pass  # the bottom-right cell: curses writes it, then fails to move the cursor past it
    screen.refresh()
