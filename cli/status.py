"""`cgctl status` (the machine at a glance) and `cgctl list` (what is allocated)."""

from __future__ import annotations

import os

import click

from computegroups.cli.connect import client, emit_json, emit_lines, json_wanted, talking
from computegroups.cli.render import colour_enabled, component_json, list_text, status_text, styler


@click.command()
def status() -> None:
    """One block per GPU: memory and SM bars, who is on it, health and marks;
    then the queue, what restarts and the jobs that ended."""
    with talking():
        doc = client().status()
    if json_wanted():
        emit_json(doc)
    else:
        emit_lines(status_text(doc, styler(colour_enabled())))


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
        emit_lines(list_text(components, reservations))


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
