"""`cgctl group`: compute groups on their own (the manager API's create/delete/deallocate/drain).

A group made here belongs to no component: `cgctl allocate NAME --group ID`
attaches components to it, and it stays until `cgctl group delete ID`.
"""

from __future__ import annotations

from typing import Any

import click

from computegroups.cli.connect import client, emit_json, emit_lines, json_wanted, talking
from computegroups.cli.options import build_claim, group_claim_options
from computegroups.cli.render import Step, devices_label, fitted_table, wrap
from computegroups.cli.terminal import WIDTH, columns

Doc = dict[str, Any]


@click.group()
def group() -> None:
    """Compute groups: create one to share by id, list, drain, free."""


@group.command("create")
@group_claim_options
@click.option("--explain", is_flag=True, help="Say why these devices were chosen (and how a sharing policy "
                                              "rounded the share).")
def create(explain: bool, **opts: Any) -> None:
    """Place a group that belongs to no component until one uses it (--group ID)."""
    claim = build_claim(opts)
    if claim is None:
        raise click.UsageError("say what the group holds: --gpus N, --memory SIZE, --mig PROFILE or --cpus N")
    with talking():
        g = client().create_group(claim)
    if json_wanted():
        emit_json(g)
        return
    emit_lines(created_text(g, explain, columns()))


def created_text(g: Doc, explain: bool = False, width: int = WIDTH) -> list[str]:
    """What `group create` prints within `width`: where the group is, how to use it, and why there
    if asked (the group's own `explanation`)."""
    lines = wrap(f"group {g['id']} created on {holds(g)}", width)
    lines += wrap(f"use it with `cgctl allocate NAME --group {g['id']} -- CMD`", width)
    if explain:
        lines += wrap(f"why: {g.get('explanation') or 'cgd gave no explanation'}", width, indent="     ")
    return lines


def holds(g: Doc) -> str:
    """`GPU 0-3`, `GPU 0[20GiB]`, or `4 CPUs` for a CPU-only group."""
    if g.get("devices"):
        return f"GPU {devices_label(g['devices'])}"
    cpus = (g.get("claim") or {}).get("cpus") if isinstance(g.get("claim"), dict) else None
    return f"{cpus} CPU{'s' if cpus != 1 else ''}" if cpus else "no device"


@group.command("list")
@click.option("--component", help="Only groups this component owns or uses.")
@click.option("--state", type=click.Choice(["reserved", "allocated", "draining", "degraded", "lost"]),
              help="Only groups in this state.")
@click.option("--gpu", type=click.IntRange(min=0), help="Only groups on this GPU.")
@click.option("--model", metavar="GLOB", help="Only groups on GPUs of this model.")
@click.option("--pool", help="Only groups inside this pool.")
@click.option("--uuid", help="Only groups on this GPU-/MIG- UUID.")
@click.option("--owner", help="Only groups of this owner (component, reservation, @LOGIN or @UID).")
@click.option("--deployment", help="Only groups of this deployment.")
def list_groups(**filters: Any) -> None:
    """Groups with their devices, owner and users."""
    with talking():
        groups = client().list_groups(**{k: v for k, v in filters.items() if v is not None})["groups"]
    if json_wanted():
        emit_json({"groups": groups})
        return
    emit_lines(groups_text(groups, columns()))


STEPS: tuple[Step, ...] = (("shrink", 4, 20), ("shrink", 3, 20), ("shrink", 0, 16), ("shrink", 4, 12),
                           ("shrink", 3, 12), ("shrink", 2, 8), ("shrink", 0, 10))
"""How `cgctl group list` fits: users and owners (long component names) narrow first, then the ids."""


def groups_text(groups: list[Doc], width: int = WIDTH) -> list[str]:
    """The groups' table within `width` columns; names shortened keep their start and their end."""
    if not groups:
        return ["no groups"]
    return fitted_table(["GROUP", "STATE", "GPUS", "OWNER", "USERS"], [group_row(g) for g in groups], width, STEPS,
                        middle=(0, 3, 4))


def group_row(g: Doc) -> list[str]:
    owner = f"{g['owner']} ({g['deployment']})" if g.get("deployment") else _login(g["owner"])
    users = sorted({u.rsplit("/", 1)[0] for u in g.get("users") or []})
    shown = ",".join(users[:2]) + (f" +{len(users) - 2}" if len(users) > 2 else "")
    gpus = holds(g).removeprefix("GPU ").replace("no device", "-")
    return [g["id"], g["state"], gpus, owner, shown or "-"]


@group.command("delete")
@click.argument("group_id", metavar="ID")
def delete(group_id: str) -> None:
    """Delete a group made by `cgctl group create`: refused while a component uses it."""
    with talking():
        done = client().delete_group(group_id)
    if json_wanted():
        emit_json(done)
        return
    emit_lines([f"group {group_id} deleted"])


@group.command("deallocate")
@click.argument("group_id", metavar="ID")
def deallocate(group_id: str) -> None:
    """Free one group where that is meaningful: delete a group of its own, scale a
    component in by the replica whose group it is, release a reservation."""
    with talking():
        done = client().deallocate_group(group_id)
    if json_wanted():
        emit_json(done)
        return
    action, owner = done["action"], done["owner"]
    if action == "scaled in":
        what = f"{owner} scaled in to {done['result'].get('replicas_wanted')} replicas"
    elif action == "deleted":
        what = "deleted"
    else:
        what = f"{action}: {owner}"
    emit_lines([f"group {group_id} freed: {what}"])


@group.command("drain")
@click.argument("group_id", metavar="ID")
@click.option("--undrain", is_flag=True, help="Let new work attach to it again.")
def drain(group_id: str, undrain: bool) -> None:
    """Drain a group: nothing new is placed on it or attaches to it; what runs keeps running."""
    cgd = client()
    with talking():
        g = cgd.undrain_group(group_id) if undrain else cgd.drain_group(group_id)
    if json_wanted():
        emit_json(g)
        return
    emit_lines([f"group {group_id} {g['state']}"])


def _login(owner: str) -> str:
    """A group made on its own is its maker's, `@UID` in the state: shown as `@LOGIN`, which
    `--owner` takes too, as `cgctl list` names people by login."""
    import pwd

    if not (owner.startswith("@") and owner[1:].isdigit()):
        return owner
    try:
        return f"@{pwd.getpwuid(int(owner[1:])).pw_name}"
    except KeyError:
        return owner

