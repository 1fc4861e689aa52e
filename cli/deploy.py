"""`cgctl apply`, `cgctl delete` and `cgctl get`: deployments from a TOML file.

The file is read here only to send it (and to find its name for `delete
-f`); cgd validates it again and names the file in its refusals, because
the file path travels with it as `source`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import click

from computegroups.cli.connect import client, emit_json, emit_lines, fail, json_wanted, talking
from computegroups.cli.render import Step, devices_label, fitted_table, owner_name, wrap
from computegroups.cli.terminal import WIDTH, columns
from computegroups.daemon.client.deployfile import DeploymentFileError, load_deployment, read_toml
from computegroups.daemon.client.endpoints import Endpoints
from computegroups.daemon.client.sync import CgdClient
from computegroups.daemon.client.wire import Request

Doc = Mapping[str, Any]
REPLICA_KEYS = ("index", "role", "state", "restarts", "promotions", "groups", "cuda_visible_devices", "pids")
DEVICE_KEYS = ("index", "uuid", "mig_uuid", "memory_mib", "compute_pct", "whole")
GROUP_KEYS = ("id", "claim", "owner", "scope", "replica", "state", "users")
CHANGE_KEYS = ("created", "groups_created", "groups_deleted", "components_created", "components_deleted",
               "workers_started", "workers_stopped")



def _file_option(required: bool) -> Any:
    return click.option("-f", "--file", "path", metavar="FILE", required=required,
                        type=click.Path(dir_okay=False, path_type=str), help="The deployment file (TOML).")


@click.command()
@_file_option(required=True)
def apply(path: str) -> None:
    """Create the deployment FILE describes, or bring it to this version of the
    file: replica counts may change; claims and sharing may not."""
    try:
        body = load_deployment(path)
    except DeploymentFileError as exc:
        fail(str(exc))
    with talking():
        result = client().apply_deployment(body)
    emit_changed(result, "created" if result["changes"]["created"] else "configured")


@click.command()
@click.argument("name", required=False)
@_file_option(required=False)
def delete(name: str | None, path: str | None) -> None:
    """Delete deployment NAME (or the one FILE describes): its components,
    workers and groups, nothing else."""
    name = deployment_name(name, path)
    with talking():
        result = client().send(Request("DELETE", f"/v1/deployments/{quote(name, safe='')}"))
    if json_wanted():
        emit_json({k: result[k] for k in ("deleted", "components", "groups", "workers")})
        return
    emit_lines([(f"deleted {result['deleted']}: {len(result['components'])} components, "
                 f"{len(result['groups'])} groups, {len(result['workers'])} workers stopped")])


@click.command()
@click.argument("name", required=False)
def get(name: str | None) -> None:
    """Show deployment NAME as a tree: set replicas, scaling groups,
    components, replicas, the groups each uses and its devices. Without
    NAME, list the deployments."""
    cgd = client()
    with talking():
        if name is None:
            found = cgd.send(Request("GET", "/v1/deployments"))["deployments"]
        else:
            found = cgd.send(Request("GET", f"/v1/deployments/{quote(name, safe='')}"))
    if json_wanted():
        emit_json({"deployments": found} if name is None else deployment_json(found))
    elif name is None:
        emit_lines(list_text(found, columns()))
    else:
        emit_lines(tree_text(found, columns()))


def scale_deployment(cgd: Endpoints[Any], target: str, replicas: int) -> dict[str, Any]:
    """Scale `S` (the set), `S/G` (a scaling group) or `S/C` (a component)
    of a deployment; answers the deployment tree with its `changes`."""
    name, _, child = target.partition("/")
    body = {"target": child or None, "replicas": replicas}
    result: dict[str, Any] = cgd.send(Request("POST", f"/v1/deployments/{quote(name, safe='')}/scale", body))
    return result


def emit_changed(result: Doc, verb: str) -> None:
    """Print what `apply` or `scale` did, as text or (--json) the deployment with its changes."""
    if json_wanted():
        emit_json(deployment_json(result))
    else:
        emit_lines(change_text(result, verb, columns()))


def deployment_names(cgd: CgdClient) -> set[str]:
    """For `cgctl scale NAME`: whether NAME is a deployment rather than a component."""
    return {d["name"] for d in cgd.send(Request("GET", "/v1/deployments"))["deployments"]}


def read_file(path: str) -> dict[str, Any]:
    """The TOML file as JSON-ready data; a file cgctl cannot read or parse
    fails here with its name, before cgd is asked anything."""
    try:
        return read_toml(path)
    except DeploymentFileError as exc:
        fail(str(exc))


def deployment_name(name: str | None, path: str | None) -> str:
    """The deployment `delete` names: NAME, or the `name` of deployment file PATH (one of them)."""
    if bool(name) == bool(path):
        raise click.UsageError("name one deployment, or give -f FILE")
    if path:
        found = read_file(path).get("name")
        if not isinstance(found, str) or not found:
            fail(f"{path}: name: required (the deployment to delete)")
        return found
    assert name is not None
    return name


# -- JSON projection and text ---------------------------------------------------


def deployment_json(d: Doc) -> dict[str, Any]:
    """The keys `get`, `apply` and `scale` print with --json (docs/cli.md)."""
    out = {
        "name": d["name"], "owner": d.get("owner"), "source": d.get("source"),
        "replicas_wanted": d.get("replicas_wanted"), "claims": d.get("claims"),
        "set_groups": d.get("set_groups"),
        "groups": [{**{k: g.get(k) for k in GROUP_KEYS},
                    "devices": [{k: x.get(k) for k in DEVICE_KEYS} for x in g.get("devices") or []]}
                   for g in d.get("groups") or []],
        "replicas": [
            {"index": r["index"], "groups": r.get("groups"),
             "components": [_component_json(c) for c in r.get("components") or []],
             "scaling_groups": [
                 {"name": sg["name"], "path": sg.get("path"), "replicas_wanted": sg.get("replicas_wanted"),
                  "groups": sg.get("groups"),
                  "replicas": [{"index": gr["index"], "groups": gr.get("groups"),
                                "components": [_component_json(c) for c in gr.get("components") or []]}
                               for gr in sg.get("replicas") or []]}
                 for sg in r.get("scaling_groups") or []]}
            for r in d.get("replicas") or []],
    }
    if "changes" in d:
        out["changes"] = {k: d["changes"].get(k) for k in CHANGE_KEYS}
    return out


def _component_json(c: Doc) -> dict[str, Any]:
    return {
        "name": c["name"], "path": c.get("path"), "state": c.get("state"), "shadow_of": c.get("shadow_of"),
        "replicas_wanted": c.get("replicas_wanted"), "groups": c.get("groups"),
        "replicas": [{**{k: r.get(k) for k in REPLICA_KEYS},
                      "devices": [{k: x.get(k) for k in DEVICE_KEYS} for x in r.get("devices") or []]}
                     for r in c.get("replicas") or []],
    }


def change_text(d: Doc, verb: str, width: int = WIDTH) -> list[str]:
    """What `apply` and `scale` print: the counts, then every name that came or went, wrapped
    within `width` (a set of twelve replicas names dozens of groups)."""
    changes = d.get("changes") or {}
    if not any(changes.get(k) for k in CHANGE_KEYS[1:]):
        verb = "unchanged"
    lines = wrap(f"deployment {d['name']} {verb}: {len(d.get('groups') or [])} groups, {_count_workers(d)} workers",
                 width)
    for key in CHANGE_KEYS[1:]:
        if changes.get(key):
            lines += wrap(f"  {key.replace('_', ' ')}: {', '.join(changes[key])}", width, indent="    ")
    return lines


def _count_workers(d: Doc) -> int:
    return sum(len(c.get("replicas") or []) for c in _components(d))


def _components(d: Doc) -> list[Doc]:
    out: list[Doc] = []
    for r in d.get("replicas") or []:
        out += r.get("components") or []
        for sg in r.get("scaling_groups") or []:
            for gr in sg.get("replicas") or []:
                out += gr.get("components") or []
    return out


LIST_STEPS: tuple[Step, ...] = (("shrink", 6, 24), ("shrink", 0, 20), ("shrink", 5, 10), ("shrink", 6, 12),
                                ("shrink", 0, 12))
"""How `cgctl get` fits: the file's path narrows first (keeping its start and its file name), then
long names and owners; the counts stay."""
GROUP_STEPS: tuple[Step, ...] = (("shrink", 3, 16), ("shrink", 1, 10), ("shrink", 0, 24), ("shrink", 0, 16),
                                 ("shrink", 3, 10), ("drop", 2, 0), ("shrink", 4, 10))
"""How the tree's group table fits: owners and claims narrow before the ids (which tell the groups
apart, shortened in the middle), then SCOPE goes; the devices are cut last."""


def list_text(deployments: Sequence[Doc], width: int = WIDTH) -> list[str]:
    if not deployments:
        return wrap("no deployments: `cgctl apply -f FILE` makes one", width)
    rows = [[d["name"], str(d.get("replicas_wanted")), str(d.get("components")), str(d.get("groups")),
             str(d.get("workers")), owner_name(d), d.get("source") or "-"] for d in deployments]
    return fitted_table(["NAME", "REPLICAS", "COMPONENTS", "GROUPS", "WORKERS", "OWNER", "FILE"], rows, width,
                        LIST_STEPS, middle=(0, 5, 6))


def tree_text(d: Doc, width: int = WIDTH) -> list[str]:
    """The deployment as a person reads it, one level per indent; a line wider than `width` wraps
    under its own level, the group table is fitted."""
    lines = [wrapped for line in _tree_lines(d) for wrapped in wrap(line, width, indent=_indent(line) + "    ")]
    groups = d.get("groups") or []
    lines += wrap(f"  groups ({len(groups)}):", width)
    rows = [[g["id"], str(g.get("claim") or "-"), g.get("scope") or "-", g.get("owner") or "-",
             devices_label(g.get("devices") or []), str(len(g.get("users") or []))] for g in groups]
    lines += ["    " + line for line in fitted_table(["GROUP", "CLAIM", "SCOPE", "OWNER", "GPUS", "USERS"], rows,
                                                      width - 4, GROUP_STEPS, middle=(0, 1, 3))]
    return lines


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip(" "))]


def _tree_lines(d: Doc) -> list[str]:
    n = d.get("replicas_wanted")
    lines = [(f"deployment {d['name']}  {n} replica{'s' if n != 1 else ''}  owner {owner_name(d)}"
              f"  file {d.get('source') or '-'}"),
             f"  set groups: {_ids(d.get('set_groups'))}"]
    for r in d.get("replicas") or []:
        lines.append(f"  replica {r['index']}  groups: {_ids(r.get('groups'))}")
        for c in r.get("components") or []:
            lines += _component_text(c, "    ")
        for sg in r.get("scaling_groups") or []:
            m = sg.get("replicas_wanted")
            lines.append(f"    scaling group {sg['name']} ({sg.get('path')})  {m} replica{'s' if m != 1 else ''}"
                         f"  groups: {_ids(sg.get('groups'))}")
            for gr in sg.get("replicas") or []:
                lines.append(f"      replica {gr['index']}  groups: {_ids(gr.get('groups'))}")
                for c in gr.get("components") or []:
                    lines += _component_text(c, "        ")
    return lines


def _component_text(c: Doc, indent: str) -> list[str]:
    shadow = f"  shadow of {c['shadow_of']}" if c.get("shadow_of") else ""
    n = c.get("replicas_wanted")
    lines = [(f"{indent}component {c['name']} ({c.get('path')})  {n} replica{'s' if n != 1 else ''}"
              f"  {c.get('state')}{shadow}  groups: {_ids(c.get('groups'))}")]
    for r in c.get("replicas") or []:
        pids = ",".join(str(p) for p in r.get("pids") or []) or "-"
        lines.append(f"{indent}  {r['index']}  {r.get('role')}  {r.get('state')}  pids {pids}"
                     f"  GPU {devices_label(r.get('devices') or [])}  groups: {_ids(r.get('groups'))}")
    return lines


def _ids(ids: Sequence[str] | None) -> str:
    return ", ".join(ids or []) or "-"
