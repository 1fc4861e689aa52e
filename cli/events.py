"""`cgctl events`: what happened on the machine, and (with --follow) what happens, as it happens."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from computegroups.cli.connect import client, json_wanted, talking
from computegroups.cli.terminal import WIDTH, columns

EPOCH_SPAN = 1_000_000_000
"""cgd numbers its events `epoch * EPOCH_SPAN + n` (docs/api.md, Events), so no run gives a number
below it but 0, "from the start"; cgd refuses those too, but a typo is a usage error here (exit 2)."""


class SeqType(click.ParamType):
    """An event's sequence number as cgd gives them: 0, or at least `EPOCH_SPAN`."""

    name = "SEQ"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            seq = int(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a sequence number", param, ctx)
        if seq != 0 and seq < EPOCH_SPAN:
            self.fail(f"{seq} is no event number of cgd: they are epoch * {EPOCH_SPAN} + n (the `seq` of an "
                      "event), or 0 for all kept", param, ctx)
        return seq


@click.command()
@click.option("-f", "--follow", is_flag=True,
              help="Keep printing events as they happen, across restarts of cgd, until Ctrl-C.")
@click.option("--since", type=SeqType(), metavar="SEQ",
              help="Only events after this sequence number (the last one you saw); default: all kept.")
@click.option("--json", is_flag=True, expose_value=False,
              help="One JSON object per line, as cgd sends them (cgctl's global --json, which may "
                   "come before or after `events`).")
def events(follow: bool, since: int | None) -> None:
    """Print cgd's events: allocations, queue, workers starting and ending,
    promotions, drains, GPU faults. You see those of your own components
    and of the machine (root sees all). With --json, one JSON object per
    line, as cgd sends them; each has a `seq` to pass to --since after a
    reconnect (a `gap` event says when some were missed). Following, a
    restart of cgd is waited for and read on from the last event shown.
    Text lines are cut to the terminal's width (80 columns in a pipe)."""
    cgd = client()
    width = columns()
    with talking():
        try:
            for event in cgd.events(since, follow, on_lost=note):
                click.echo(json.dumps(event, sort_keys=True) if json_wanted() else event_line(event, width))
        except KeyboardInterrupt:
            return


def note(line: str) -> None:
    """Said once when cgd goes away under `--follow`, on stderr so --json's lines stay JSON."""
    click.echo(f"cgctl: {line}", err=True)


def event_line(event: dict[str, Any], width: int = WIDTH) -> str:
    """`12:03:51 1000000042 alice    train/0 (pid 812) ended: signal SIGKILL; ...`, cut to `width`.

    The message says what happened in words; `--json` has the type and the details.

    >>> event_line({"seq": 7, "time": 0, "type": "drained", "user": None, "message": "GPU 3 drained"})[8:]
    '          7 -        GPU 3 drained'
    """
    when = time.strftime("%H:%M:%S", time.localtime(event.get("time") or 0))
    seq = event.get("seq")
    line = f"{when} {seq if seq is not None else '-':>10} {event.get('user') or '-':<8} {event.get('message', '')}"
    return line if len(line) <= width else line[:width - 3] + "..."
