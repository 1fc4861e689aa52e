"""`cgctl render kubernetes`: a deployment file as Kubernetes manifests, with no cgd and no cluster.

The manifests go to stdout as multi-document YAML, so they pipe into
`kubectl apply -f -`; what the file says that has no Kubernetes form goes
to stderr, one `cgctl: warning: <field>: ...` line each, so that nothing
is dropped silently and stdout stays a clean manifest. The mapping is in
docs/kubernetes.md and computegroups.daemon.kubernetes.render.
"""

from __future__ import annotations

import textwrap
from typing import Any

import click

from computegroups.cli.connect import fail
from computegroups.daemon.client.deployfile import DeploymentFileError, load_deployment

WIDTH = 80


@click.group()
def render() -> None:
    """Print a deployment file as manifests for elsewhere (no cgd needed)."""


@render.command()
@click.option("-f", "--file", "path", metavar="FILE", required=True,
              type=click.Path(dir_okay=False, path_type=str), help="The deployment file (TOML).")
@click.option("-n", "--namespace", metavar="NS", default="default", show_default=True,
              help="The namespace of the manifests.")
@click.option("--image", metavar="IMAGE",
              help="The container image of every component that names no `image` of its own.")
@click.option("--sharing", type=click.Choice(["dra", "mps"]), default="dra", show_default=True,
              help="A share as DRA consumable capacity, or as NVIDIA's MPS configuration.")
def kubernetes(path: str, namespace: str, image: str | None, sharing: str) -> None:
    """Print FILE as a Grove PodCliqueSet with DRA claims (YAML on stdout),
    and a warning on stderr for each field with no Kubernetes form."""
    # Loaded here, not with the module: `cgctl --help` lists this command.
    from computegroups.daemon.kubernetes.render import RenderError, render_deployment
    from computegroups.daemon.model.deployment import DeploymentError, parse

    dump = _yaml_dumper()
    body = read_deployment(path)
    try:
        rendered = render_deployment(parse(body["spec"], source=path, included=body.get("included")),
                                     namespace=namespace, image=image, sharing=sharing)
    except DeploymentError as exc:
        fail(str(exc))
    except RenderError as exc:
        fail(f"{path}: {exc}")
    for warning in rendered.warnings:
        lines = textwrap.wrap(f"cgctl: warning: {warning}", WIDTH, subsequent_indent="  ",
                              break_on_hyphens=False)
        click.echo("\n".join(lines), err=True)
    click.echo(dump(rendered.documents), nl=False)


def read_deployment(path: str) -> dict[str, Any]:
    """The file and the files its `include` names, read as `cgctl apply` reads them (`spec`, `included`)."""
    try:
        return load_deployment(path)
    except DeploymentFileError as exc:
        fail(str(exc))


def _yaml_dumper() -> Any:
    """The YAML writer: block style, keys in the order rendered, multi-line
    text as literal blocks (a command that is a script reads as one)."""
    try:
        import yaml
    except ImportError:
        from computegroups.daemon.kubernetes.cluster_errors import INSTALL_HINT  # not for `cgctl --help`

        fail(f"rendering YAML needs PyYAML: {INSTALL_HINT}")

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper: yaml.SafeDumper, value: str) -> Any:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)

    def dump(documents: list[dict[str, Any]]) -> str:
        out: str = yaml.dump_all(documents, Dumper=Dumper, sort_keys=False, width=WIDTH,
                                 default_flow_style=False, explicit_start=True)
        return out

    return dump
