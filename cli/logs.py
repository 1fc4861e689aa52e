"""`cgctl logs`: a replica's stdout or stderr, once or followed."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from computegroups.cli.connect import client, complete_components, json_wanted, talking
from computegroups.cli.events import note
from computegroups.cli.options import NAME
from computegroups.daemon.client.errors import CgdError, CgdUnreachable
from computegroups.daemon.client.resume import Reconnect
from computegroups.daemon.client.sync import CgdClient

POLL_S = 0.5


@click.command()
@click.argument("name", type=NAME, shell_complete=complete_components)
@click.option("--replica", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--stream", type=click.Choice(["stdout", "stderr"]), default="stdout", show_default=True)
@click.option("--tail", type=click.IntRange(min=0), help="Only the last N lines.")
@click.option("-f", "--follow", is_flag=True, help="Keep printing what is written, until Ctrl-C.")
def logs(name: str, replica: int, stream: str, tail: int | None, follow: bool) -> None:
    """Print what NAME's replica wrote. With --json, one JSON object per
    line: the first read, then each read that brought data."""
    cgd = client()
    with talking():
        doc = cgd.component_logs(name, replica, stream, tail=tail)
        _show(doc)
        if stream == "stdout" and not doc.get("size") and not json_wanted():
            _hint_stderr(cgd, name, replica)
        if follow:
            try:
                _follow(cgd, name, replica, stream, doc)
            except KeyboardInterrupt:
                return


def _hint_stderr(cgd: CgdClient, name: str, replica: int) -> None:
    """An empty stdout is often a program that writes to stderr, or one that never started: say so,
    with the end of its stderr when the replica ended badly."""
    errors = cgd.component_logs(name, replica, "stderr", tail=10)
    if not errors.get("size"):
        click.echo(f"cgctl: {name} replica {replica} has written nothing yet (stdout and stderr are empty)",
                   err=True)
        return
    click.echo(f"cgctl: nothing on stdout; {name} replica {replica} wrote {errors['size']} bytes to stderr "
               f"(`cgctl logs {name} --stream stderr`, {errors['path']})", err=True)
    component = cgd.get_component(name)
    states = [r.get("state") for r in component.get("replicas") or [] if r.get("index") == replica]
    if states and states[0] in ("failed", "restarting", "timeout"):
        click.echo(f"its last lines ({states[0]}):", err=True)
        click.echo(errors.get("data") or "", nl=False, err=True)


def _show(doc: dict[str, Any]) -> None:
    """With --json one compact object per line, so `-f` gives JSON lines."""
    if json_wanted():
        click.echo(json.dumps(doc, sort_keys=True))
    elif doc.get("data"):
        click.echo(doc["data"], nl=False)


def _follow(cgd: CgdClient, name: str, replica: int, stream: str, last: dict[str, Any]) -> None:
    """Poll from the last offset, at once while cgd still holds more (it
    sends at most 1 MiB per read); a shrunk file was rotated, so start it
    over; a released component ends the follow with a note, not an error.
    A restart of cgd is waited for as `cgctl events -f` waits for it
    (`Reconnect`, one note per outage), and read on from the same offset:
    the log file is the worker's, not cgd's."""
    offset, size = last["offset"], last["size"]
    reconnect = Reconnect(note, lambda error: f"cgd went away; reconnecting to follow {name}/{replica}'s "
                                              f"{stream} from byte {offset}")
    reconnect.opened()
    while True:
        if offset >= size:
            time.sleep(POLL_S)
        try:
            doc = cgd.component_logs(name, replica, stream, offset=offset)
        except CgdUnreachable as exc:
            time.sleep(reconnect.retry(exc))
            continue
        except CgdError as exc:
            if exc.code != "not_found":
                raise
            click.echo(f"cgctl: {name} is gone ({exc.message}); stopped following", err=True)
            return
        reconnect.opened()
        if doc["size"] < offset:
            offset, size = 0, doc["size"]
            continue
        if doc.get("data"):
            _show(doc)
        offset, size = doc["offset"], doc["size"]
