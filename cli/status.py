"""`cgctl status` and `cgctl top` (the machine at a glance), `cgctl list` (what is allocated)."""

from __future__ import annotations

import os
import sys
import time

import click

from computegroups.cli.connect import client, emit_json, emit_lines, json_wanted, talking
from computegroups.cli.render import colour_enabled, component_json, list_text, styler
from computegroups.cli.status_long import long_lines
from computegroups.cli.status_view import STALE_AFTER_S, Board, status_json, status_lines
from computegroups.cli.terminal import columns
from computegroups.daemon.client.sync import CgdClient

INTERVAL = click.option("--interval", "-n", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
                        metavar="SECONDS", help="How often to look again when redrawing.")


def look(cgd: CgdClient) -> Board:
    """One look at cgd: who is on each GPU, the state and role each of them is in, and how old a
    measurement may be before it is stale (three periods of cgd's health loop, when cgd says it)."""
    return Board.of(cgd.status(), cgd.list_components()["components"], cgd.list_reservations()["reservations"],
                    now=time.time(), stale_after_s=stale_after(cgd.health()), groups=cgd.list_groups()["groups"])


def stale_after(health: dict[str, object]) -> float:
    """Three of the health loop's periods (`interval_s` of `GET /v1/health`): a sample older than that
    means the loop missed two; an older cgd that does not say its period gets `STALE_AFTER_S`."""
    interval = health.get("interval_s")
    return 3 * float(interval) if isinstance(interval, (int, float)) and interval > 0 else STALE_AFTER_S


@click.command()
@click.option("--watch", "-w", is_flag=True, help="Redraw in place until Ctrl-C or q (like `cgctl top`).")
@INTERVAL
@click.option("--long", "long_", is_flag=True,
              help="One block per GPU (bars, MIG instances, reasons), then the groups made on their own.")
def status(watch: bool, interval: float, long_: bool) -> None:
    """One line per GPU: utilisation, memory used (measured) against memory
    claimed, temperature, and who is on it in which state; then a summary,
    the alerts, the queue, what restarts and the jobs that ended."""
    source = click.get_current_context().get_parameter_source("interval")
    if not watch and source is click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("--interval is how often --watch redraws: give --watch too")
    cgd = client()
    if watch and not json_wanted() and sys.stdout.isatty() and sys.stdin.isatty():
        _watch(cgd, interval, long_)
        return
    with talking():
        board = look(cgd)
    if json_wanted():
        emit_json(status_json(board))
    else:
        draw = long_lines if long_ else status_lines
        emit_lines(draw(board, styler(colour_enabled()), columns()))


@click.command()
@INTERVAL
@click.pass_context
def top(ctx: click.Context, interval: float) -> None:
    """`cgctl status --watch`: the status redrawn in place; on a box taller
    than the terminal, one line per NVLink island (Enter opens one)."""
    ctx.invoke(status, watch=True, interval=interval, long_=False)


def _watch(cgd: CgdClient, interval: float, long: bool) -> None:
    from computegroups.cli.watch import watch

    with talking():
        machine = cgd.machine()
        first = look(cgd)
    watch(lambda: look(cgd), first, machine["nvlink_islands"], interval, machine.get("hostname") or "", long)


@click.command(name="list")
@click.option("--mine", is_flag=True, help="Only your own components.")
def list_components(mine: bool) -> None:
    """Components with their replicas, roles, devices, pids, state and owner;
    then the reservations."""
    cgd = client()
    with talking():
        components = cgd.list_components(os.getuid() if mine else None)["components"]
        reservations = cgd.list_reservations()["reservations"]
    if mine:
        reservations = [r for r in reservations if (r.get("owner") or {}).get("uid") == os.getuid()]
    if json_wanted():
        emit_json({"components": [component_json(c) for c in components], "reservations": reservations})
    else:
        emit_lines(list_text(components, reservations, columns()))


@click.command(name="ack-state-loss")
def ack_state_loss() -> None:
    """Stop the warning about workers started by a lost generation of cgd's state
    (root). The workers keep running; stop them yourself if they should not."""
    with talking():
        reply = client().acknowledge_state_loss()
    if json_wanted():
        emit_json(reply)
    elif reply["acknowledged"]:
        emit_lines([f"acknowledged: {', '.join(w['replica'] for w in reply['acknowledged'])}"])
    else:
        emit_lines(["no state loss to acknowledge"])
