"""cgctl: the command line of computegroups.

This file only declares the global options and names the command modules;
each command lives in its own module, imported when it runs (or when
`--help` lists it), so `cgctl --version` and every command pay only for
what they use. Commands fail through `computegroups.cli.connect.fail` (one
line `cgctl: error: ...`, exit 1); click's own usage errors exit 2.
"""

from __future__ import annotations

import importlib
import sys

import click

from computegroups import __version__
from computegroups.cli.context import CliContext

COMMANDS = {
    "ack-state-loss": "status:ack_state_loss",
    "allocate": "allocate:allocate",
    "apply": "deploy:apply",
    "delete": "deploy:delete",
    "drain": "drain:drain",
    "env": "env:env",
    "events": "events:events",
    "get": "deploy:get",
    "group": "groups:group",
    "install-service": "service:install_service",
    "list": "status:list_components",
    "logs": "logs:logs",
    "release": "release:release",
    "render": "kubernetes_render:render",
    "reserve": "allocate:reserve",
    "restart": "release:restart",
    "run": "run:run",
    "scale": "release:scale",
    "status": "status:status",
    "top": "status:top",
    "topo": "topo:topo",
    "wait": "wait:wait",
}
"""Command name -> `module:attribute` under computegroups.cli."""
KUBERNETES_COMMANDS = {
    "apply": "kubernetes_cmds:apply",
    "delete": "kubernetes_cmds:delete",
    "events": "kubernetes_cmds:events",
    "get": "kubernetes_cmds:get",
    "list": "kubernetes_cmds:list_groups",
}
"""The same commands on a cluster, with `--kubernetes` (the client's Kubernetes provider, not cgd)."""


class Cgctl(click.Group):
    """The commands of `COMMANDS`, each imported on first use.

    `--json` may come after the command name too (`cgctl list --json`), as
    people type it. It is moved in front of the command before parsing,
    except after `--`, where it belongs to the worker's command.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        if ctx.params.get("kubernetes"):
            if cmd_name not in KUBERNETES_COMMANDS:
                raise click.UsageError(f"{cmd_name}: not a --kubernetes command (those are "
                                       f"{', '.join(sorted(KUBERNETES_COMMANDS))})")
            target = KUBERNETES_COMMANDS[cmd_name]
        module, attribute = target.split(":")
        command: click.Command = getattr(importlib.import_module(f"computegroups.cli.{module}"), attribute)
        return command

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        end = args.index("--") if "--" in args else len(args)
        if "--json" in args[:end]:
            args = ["--json", *(a for a in args[:end] if a != "--json"), *args[end:]]
        return super().parse_args(ctx, args)


@click.group(cls=Cgctl, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--socket", metavar="PATH", envvar="CG_SOCKET",
              help="cgd's socket (default: the user or system socket; env CG_SOCKET).")
@click.option("--simulate", metavar="NAME|PATH", envvar="CG_SIMULATE",
              help="Use a simulated machine instead of NVML: a shipped name or a machine file "
                   "(env CG_SIMULATE).")
@click.option("--json", "json_output", is_flag=True, help="Print JSON instead of text.")
@click.option("--kubernetes", is_flag=True,
              help="apply, get, delete and list on a Kubernetes cluster (kubeconfig as kubectl finds it).")
@click.option("--context", metavar="NAME", help="With --kubernetes: the kubeconfig context.")
@click.option("--namespace", metavar="NS", help="With --kubernetes: the namespace (default: the context's).")
@click.version_option(__version__, prog_name="cgctl")
@click.pass_context
def cli(ctx: click.Context, socket: str | None, simulate: str | None, json_output: bool, kubernetes: bool,
        context: str | None, namespace: str | None) -> None:
    """Allocate GPUs and run workloads on them through cgd."""
    if (context or namespace) and not kubernetes:
        raise click.UsageError("--context and --namespace go with --kubernetes")
    ctx.obj = CliContext(socket=socket, simulate=simulate or None, json=json_output, kubernetes=kubernetes,
                         context=context, namespace=namespace)


def command_path(args: list[str]) -> str:
    """`cgctl events` for `events --since` with its value missing: the command a usage error is
    about, when click's parser raised it without the command's context (an option's missing value)."""
    path, ctx = ["cgctl"], click.Context(cli)
    command: click.Command = cli
    for arg in args:
        if arg == "--" or not isinstance(command, click.Group):
            break
        found = None if arg.startswith("-") else command.get_command(ctx, arg)
        if found is not None:
            path.append(arg)
            command = found
    return " ".join(path)


def main() -> None:
    """Run cgctl; usage mistakes get the same one-line form as other errors."""
    try:
        code = cli.main(prog_name="cgctl", standalone_mode=False)
    except click.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError" and exc.ctx is not None:
            click.echo(exc.ctx.get_help())  # `cgctl`, `cgctl group`: what is there, as git and kubectl answer
            sys.exit(0)
        where = exc.ctx.command_path if exc.ctx is not None else command_path(sys.argv[1:])
        click.echo(f"cgctl: error: {exc.format_message()} (see `{where} --help`)", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"cgctl: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("cgctl: aborted", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
