"""`cgctl release`, `cgctl scale` and `cgctl restart`: give capacity back, change how much, start again."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from computegroups.cli.connect import (
    client,
    complete_components,
    emit_json,
    emit_lines,
    json_wanted,
    talking,
)
from computegroups.cli.deploy import deployment_names, emit_changed, scale_deployment
from computegroups.cli.options import NAME, DurationType
from computegroups.cli.render import component_json, component_text, shorten, wrap
from computegroups.cli.terminal import WIDTH, columns
from computegroups.daemon.client.errors import CgdError
from computegroups.daemon.client.sync import CgdClient


@click.command()
@click.argument("names", metavar="[NAME]...", nargs=-1, type=NAME, shell_complete=complete_components)
@click.option("--all", "everything", is_flag=True, help="Release all of your components and reservations.")
@click.option("--stop-timeout", type=DurationType(), metavar="DURATION",
              help="Grace before the workers are killed (default: each component's own, 10s).")
def release(names: tuple[str, ...], everything: bool, stop_timeout: float | None) -> None:
    """Release the components (or reservations) NAME..., stopping their workers.

    Every name is checked before any is released: an unknown one, or one
    you may not release, leaves the others running. On a terminal it shows
    what it waits for while the workers stop.
    """
    if names and everything:
        raise click.UsageError("name the components to release, or give --all, not both")
    if not names and not everything:
        raise click.UsageError("name the components to release, or give --all")
    if everything and stop_timeout is not None:
        raise click.UsageError("--stop-timeout applies to named components: name them")
    cgd = client()
    wanted = list(dict.fromkeys(names))
    with talking():
        if everything:
            result = _release_all(cgd)
        else:
            with _progress(cgd, wanted, stop_timeout) as grace:
                cgd.timeout = max(cgd.timeout, grace + 30)
                result = cgd.release_components(wanted, stop_timeout)
    if json_wanted():
        emit_json(result)
        return
    emit_lines(release_text(result, columns()))


def release_text(result: dict[str, Any], width: int) -> list[str]:
    """`released web (groups web-0)`; the names of many replicas' groups wrap within `width`."""
    released = result["released"] + result["reservations"]
    if not released:
        return ["nothing to release"]
    groups = f" (groups {', '.join(result['groups'])})" if result["groups"] else ""
    return wrap(f"released {', '.join(released)}{groups}", width)


@contextmanager
def _progress(cgd: CgdClient, names: list[str], stop_timeout: float | None) -> Iterator[float]:
    """Yield the longest grace the workers get; meanwhile, on a terminal, say every half second what
    is awaited.

    A release returns only once nothing of the workers runs, which takes up
    to the grace (then SIGKILL): silence for that long reads as a hang.
    """
    graces, pids = [], []
    for name in names:
        try:
            component = cgd.get_component(name)
        except CgdError:
            continue  # not a component (a reservation?): the release says what it is
        graces.append(stop_timeout if stop_timeout is not None else float(component.get("stop_timeout_s") or 10.0))
        pids += [p for r in component.get("replicas") or [] for p in r.get("pids") or []]
    grace = max(graces, default=stop_timeout or 0.0)
    if not pids or not sys.stderr.isatty():
        yield grace
        return
    done = threading.Event()
    who = ", ".join(names)

    def show() -> None:
        start = time.monotonic()
        what = f"{len(pids)} worker{'s' if len(pids) != 1 else ''} (pid {', '.join(map(str, pids[:4]))}" + (
            ", ...)" if len(pids) > 4 else ")")
        while not done.wait(0.5):
            waited = time.monotonic() - start
            line = f"stopping {who}: waiting for {what} to exit, {waited:.0f}s of {grace:g}s before SIGKILL"
            # one line redrawn in place: never wider than the terminal, or it would scroll
            width = _stderr_columns() - 1
            click.echo(f"\r{shorten(line, width)}", nl=False, err=True)
        click.echo("\r\033[K", nl=False, err=True)

    shower = threading.Thread(target=show, daemon=True)
    shower.start()
    try:
        yield grace
    finally:
        done.set()
        shower.join()


def _release_all(cgd: CgdClient) -> dict[str, Any]:
    done = cgd.release_all()
    uid = os.getuid()
    mine = [r["name"] for r in cgd.list_reservations()["reservations"] if (r.get("owner") or {}).get("uid") == uid]
    groups = list(done["groups"])
    for name in mine:
        groups += cgd.delete_reservation(name).get("groups", [])
    return {"released": done["released"], "groups": sorted(groups), "reservations": mine}


@click.command()
@click.argument("name", shell_complete=complete_components)  # may be a deployment path S/G
@click.option("--replicas", type=click.IntRange(min=0), required=True, help="The new replica count.")
def scale(name: str, replicas: int) -> None:
    """Change NAME's replica count: scale-in stops the highest replicas and
    frees their groups; scale-out allocates new ones. NAME may be a
    deployment S, or S/G (a scaling group) or S/C (a component) of it."""
    cgd = client()
    with talking():
        if "/" in name or name in deployment_names(cgd):
            emit_changed(scale_deployment(cgd, name, replicas), "scaled")
            return
        component = cgd.scale_component(name, replicas)
    if json_wanted():
        emit_json(component_json(component))
    else:
        emit_lines(component_text(component, "scaled", width=columns()))


@click.command()
@click.argument("name", type=NAME, shell_complete=complete_components)
@click.option("--replica", type=click.IntRange(min=0), default=None,
              help="Restart only this replica (default: all of them).")
def restart(name: str, replica: int | None) -> None:
    """Stop and start NAME's workers on the same groups: the way back for a
    replica that used up its restarts. A shadow is not promoted."""
    cgd = client()
    with talking():
        component = cgd.restart_component(name, replica)
    if json_wanted():
        emit_json(component_json(component))
    else:
        emit_lines(component_text(component, "restarted", width=columns()))


def _stderr_columns() -> int:
    """The width of the terminal stderr writes to (where the progress line goes); 80 when it says none."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns or WIDTH
    except OSError:
        return WIDTH
