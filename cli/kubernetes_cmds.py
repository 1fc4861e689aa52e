"""`cgctl --kubernetes apply / get / delete / list / events`: the same commands on a cluster.

They go through the client's Kubernetes provider (computegroups.daemon.kubernetes),
never through cgd: deployments are Grove PodCliqueSets applied server-side,
`list` shows the compute groups (DRA ResourceClaims) the provider made. The
kubeconfig is found as kubectl finds it (`$KUBECONFIG`, `~/.kube/config`,
in-cluster), at `--context` and `--namespace` when given. lightkube is an
optional extra: without it each command says how to install it.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from computegroups.cli.connect import emit_json, emit_lines, fail, json_wanted
from computegroups.cli.context import CliContext
from computegroups.cli.deploy import deployment_name
from computegroups.cli.kubernetes_render import read_deployment
from computegroups.cli.render import devices_label, table
from computegroups.daemon.client.errors import ClientError
from computegroups.daemon.kubernetes import provider_class as kubernetes_provider
from computegroups.daemon.kubernetes.cluster_errors import KubernetesExtraMissing

T = TypeVar("T")
WIDTH = 80


def _options() -> CliContext:
    return click.get_current_context().find_object(CliContext) or CliContext()


def on_cluster(work: Callable[[Any], Awaitable[T]]) -> T:
    """Run `work(provider)` on the cluster; every failure is one `cgctl: error:` line."""
    opts = _options()
    try:
        provider_class = kubernetes_provider("--kubernetes")
    except KubernetesExtraMissing as exc:
        fail(str(exc))

    async def run() -> T:
        provider = provider_class(context=opts.context, namespace=opts.namespace)
        try:
            return await work(provider)
        finally:
            await provider.close()

    try:
        return asyncio.run(run())
    except (ClientError, ValueError) as exc:
        fail(str(exc))


def _deployments(provider: Any) -> Any:
    from computegroups.daemon.kubernetes.provider_deployments import KubernetesDeployments

    return KubernetesDeployments(provider)


def _wrapped(text: str, indent: str = "  ") -> list[str]:
    return textwrap.wrap(text, WIDTH, subsequent_indent=indent, break_on_hyphens=False) or [""]


@click.command()
@click.option("-f", "--file", "path", metavar="FILE", required=True,
              type=click.Path(dir_okay=False, path_type=str), help="The deployment file (TOML).")
@click.option("--image", metavar="IMAGE",
              help="The container image of every component that names no `image` of its own.")
@click.option("--sharing", type=click.Choice(["dra", "mps"]), default="dra", show_default=True,
              help="A share as DRA consumable capacity, or as NVIDIA's MPS configuration.")
def apply(path: str, image: str | None, sharing: str) -> None:
    """Create the deployment FILE describes on the cluster, as a Grove
    PodCliqueSet (server-side apply), or bring it to this version."""
    body = read_deployment(path)
    result = on_cluster(lambda p: _deployments(p).apply(body["spec"], image=image, source=path, sharing=sharing,
                                                        included=body.get("included")))
    for warning in result["warnings"]:
        click.echo("\n".join(_wrapped(f"cgctl: warning: {warning}")), err=True)
    if json_wanted():
        emit_json(result)
        return
    verb = "created" if result["created"] else "configured"
    emit_lines(_wrapped(f"deployment {result['name']} {verb} in namespace {result['namespace']}: "
                        f"{', '.join(result['applied'])}"))


@click.command()
@click.argument("name", required=False)
def get(name: str | None) -> None:
    """Show deployment NAME on the cluster: its cliques, scaling groups,
    claims and Grove's status. Without NAME, list the deployments."""
    if name is None:
        found = on_cluster(lambda p: _deployments(p).list())
        if json_wanted():
            emit_json({"deployments": found})
        elif not found:
            emit_lines(["no deployments: `cgctl --kubernetes apply -f FILE --image IMAGE` makes one"])
        else:
            emit_lines(table(["NAME", "NAMESPACE", "REPLICAS", "CLIQUES", "CLAIMS"],
                             [[d["name"], d["namespace"], str(d["replicas"]), str(len(d["cliques"])),
                               str(len(d["claims"]))] for d in found]))
        return
    d = on_cluster(lambda p: _deployments(p).get(name))
    if json_wanted():
        emit_json(d)
        return
    n = d["replicas"]
    lines = [f"deployment {d['name']}  {n} replica{'s' if n != 1 else ''}  namespace {d['namespace']}"]
    lines += [f"  clique {c['name']}  replicas {c['replicas']}" for c in d["cliques"]]
    for g in d["scaling_groups"]:
        lines += _wrapped(f"  scaling group {g['name']}  replicas {g['replicas']}  cliques "
                          f"{', '.join(g['cliques'] or [])}", "    ")
    lines += _wrapped(f"  claims: {', '.join(d['claims']) or '-'}", "    ")
    conditions = d["status"].get("conditions") or []
    lines += [f"  {c.get('type')}: {c.get('status')}" for c in conditions] or ["  status: not reported yet"]
    emit_lines(lines)


@click.command()
@click.argument("name", required=False)
@click.option("-f", "--file", "path", metavar="FILE", type=click.Path(dir_okay=False, path_type=str),
              help="The deployment file (TOML) whose deployment to delete.")
def delete(name: str | None, path: str | None) -> None:
    """Delete deployment NAME (or the one FILE describes) from the cluster:
    its PodCliqueSet, and with it Grove's pods and claims."""
    name = deployment_name(name, path)
    result = on_cluster(lambda p: _deployments(p).delete(name))
    if json_wanted():
        emit_json(result)
    else:
        emit_lines([f"deleted {result['deleted']} (PodCliqueSet in namespace {result['namespace']})"])


@click.command(name="list")
def list_groups() -> None:
    """The compute groups computegroups made on the cluster (DRA ResourceClaims
    with their holder pods), and why any still waits for the scheduler."""
    async def read(provider: Any) -> dict[str, Any]:
        groups, components = await asyncio.gather(provider.list_groups({}), provider.list_components())
        return {"groups": groups, "components": components}

    found = on_cluster(read)
    if json_wanted():
        emit_json(found)
        return
    groups = found["groups"]
    if not groups:
        emit_lines(["nothing allocated on the cluster: ComputeGroupManager with the "
                    "Kubernetes provider makes groups (docs/client.md)"])
        return
    rows = [[g["id"], g["owner"] or "-", g["state"], g.get("node") or "-", devices_label(g["devices"]) or "-"]
            for g in groups]
    lines = table(["GROUP", "COMPONENT", "STATE", "NODE", "GPUS"], rows)
    waiting = [g for g in groups if g["state"] == "pending"]
    if waiting:
        lines.append("")
        for g in waiting:
            lines += _wrapped(f"{g['id']} waits: {g['explanation']}", "    ")
    emit_lines(lines)


@click.command()
@click.option("-f", "--follow", is_flag=True, help="Keep printing the cluster's changes as they happen, until Ctrl-C.")
@click.option("--since", type=int, metavar="VERSION",
              help="Only changes after this resourceVersion (the last `seq` you saw); default: the groups as "
                   "they are now.")
def events(follow: bool, since: int | None) -> None:
    """Print the changes of the groups computegroups made on the cluster as
    cgd's events: queued (and the scheduler's reason), placed, released, a
    holder's container that exited. `seq` is the change's resourceVersion;
    a version the API server no longer keeps is a `gap` line, then the
    groups as they are now (docs/kubernetes.md, Events on a cluster)."""
    from computegroups.cli.events import event_line

    async def show(provider: Any) -> None:
        async for event in provider.events(since, follow):
            click.echo(json.dumps(event, sort_keys=True) if json_wanted() else event_line(event, WIDTH))

    try:
        on_cluster(show)
    except KeyboardInterrupt:
        return
