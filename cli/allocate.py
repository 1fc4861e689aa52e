"""`cgctl allocate` and `cgctl reserve`: ask cgd for devices, now or held."""

from __future__ import annotations

import time
from typing import Any

import click

from computegroups.cli.connect import client, emit_json, emit_lines, json_wanted, talking
from computegroups.cli.options import (
    NAME,
    DurationType,
    attach_options,
    build_component,
    build_reservation,
    claim_options,
    job_options,
    process_options,
    shape_options,
    wait_options,
)
from computegroups.cli.render import component_json, component_text, devices_label, wrap
from computegroups.cli.terminal import columns
from computegroups.cli.wait import queued_lines, wait_for_place, wait_timeout
from computegroups.daemon.client.sync import CgdClient


@click.command()
@click.argument("name", type=NAME)
@claim_options
@shape_options
@attach_options
@process_options
@job_options
@wait_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD ARGS...]")
def allocate(name: str, command: tuple[str, ...], explain: bool, wait: str | None, detach: bool,
             **opts: Any) -> None:
    """Allocate devices to component NAME; with CMD, also start its workers.

    Without a size flag the component takes the reservation NAME
    (`cgctl reserve`), the groups of --share-with / --shadow-of, or --group.
    A command that exits 0 is done (restarted only on failure, unless
    --restart says otherwise) and gives its devices back; `cgctl wait NAME`
    waits for it and exits with its exit code.
    """
    timeout = wait_timeout(wait, detach)
    body = build_component(name, opts, command)
    if wait is not None or detach:
        body["wait"] = True
        body["detach"] = detach
    cgd = client()
    with talking():
        if "claim" not in body and not ({"share_with", "shadow_of", "group"} & set(body)):
            _require_reservation(cgd, name)
        component = cgd.create_component(body)
    if component.get("state") == "pending" and not detach:
        component = wait_for_place(cgd, component, timeout)
    if json_wanted():
        emit_json(component_json(component))
    elif component.get("state") == "pending":
        width = columns()
        emit_lines([*queued_lines(component, width),
                    *wrap(f"it runs when its turn comes; `cgctl wait {name}` waits for its end", width)])
    else:
        emit_lines(component_text(component, "started" if command else "allocated", explain, columns()))


def _require_reservation(cgd: CgdClient, name: str) -> None:
    """Without a claim cgd can only use a reservation (or, on a machine without GPUs, run the
    component CPU-only); say what to type before asking it, rather than relay a missing-field error."""
    if any(r["name"] == name for r in cgd.list_reservations()["reservations"]):
        return
    if cgd.version()["machine"]["gpus"]:
        raise click.UsageError(
            f"say what {name} needs: --gpus N, --memory SIZE, --mig PROFILE or --cpus N "
            f"(or `cgctl reserve {name} ...` first, or --share-with COMPONENT)")


@click.command()
@click.argument("name", type=NAME)
@claim_options
@shape_options
@click.option("--ttl", type=DurationType(), default="10m", show_default=True,
              help="How long the capacity is held before it expires (90s, 10m, 1h).")
def reserve(name: str, ttl: float, **opts: Any) -> None:
    """Hold capacity for NAME; `cgctl allocate NAME` later takes it."""
    body = build_reservation(name, opts, ttl)
    with talking():
        reservation = client().create_reservation(body)
    if json_wanted():
        emit_json(reservation)
        return
    groups = reservation.get("groups") or []
    devices = devices_label(d for g in groups for d in g.get("devices") or [])
    until = time.strftime("%H:%M:%S", time.localtime(reservation["expires_at"]))
    # The commands stay whole, to be copied as they are: only the first line is wrapped.
    emit_lines([
        *wrap(f"reserved {name}: {len(groups)} group{'s' if len(groups) != 1 else ''} on GPU {devices} "
              f"until {until}", columns()),
        f"take it:  cgctl allocate {name} -- CMD",
        f"free it:  cgctl release {name}",
    ])
