"""`cgctl release`, `cgctl scale` and `cgctl restart`: give capacity back, change how much, start again."""

from __future__ import annotations

import os
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
from computegroups.cli.options import NAME
from computegroups.cli.render import component_json, component_text
from computegroups.daemon.client.errors import CgdError
from computegroups.daemon.client.sync import CgdClient


@click.command()
@click.argument("name", type=NAME, required=False, shell_complete=complete_components)
@click.option("--all", "everything", is_flag=True, help="Release all of your components and reservations.")
def release(name: str | None, everything: bool) -> None:
    """Release component (or reservation) NAME, stopping its workers."""
    if bool(name) == everything:
        raise click.UsageError("name one component, or give --all")
    cgd = client()
    with talking():
        result = _release_all(cgd) if everything else _release_one(cgd, name or "")
    if json_wanted():
        emit_json(result)
        return
    released = result["released"] + result["reservations"]
    if not released:
        emit_lines(["nothing to release"])
        return
    groups = f" (groups {', '.join(result['groups'])})" if result["groups"] else ""
    emit_lines([f"released {', '.join(released)}{groups}"])


def _release_one(cgd: CgdClient, name: str) -> dict[str, Any]:
    """A component first; a reservation of that name is the other thing a
    user can have made with that name."""
    try:
        done = cgd.release_component(name)
        return {"released": done["released"], "groups": done["groups"], "reservations": []}
    except CgdError as exc:
        if exc.code != "not_found":
            raise
        try:
            done = cgd.delete_reservation(name)
        except CgdError as missing:
            if missing.code != "not_found":
                raise
            raise exc from None
        return {"released": [], "groups": done.get("groups", []), "reservations": [name]}


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
        emit_lines(component_text(component, "scaled"))


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
        emit_lines(component_text(component, "restarted"))
