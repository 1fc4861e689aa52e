"""cgctl: the command line of computegroups.

This file only declares the global options and registers the command
modules; each command lives in its own module. Commands fail through
`computegroups.cli.connect.fail` (one line `cgctl: error: ...`, exit 1); click's own usage
errors exit 2.
"""

from __future__ import annotations

import sys

import click

from computegroups.cli.allocate import allocate, reserve
from computegroups.cli.context import CliContext
from computegroups.cli.deploy import apply, delete, get
from computegroups.cli.drain import drain
from computegroups.cli.env import env
from computegroups.cli.logs import logs
from computegroups.cli.release import release, restart, scale
from computegroups.cli.run import run
from computegroups.cli.service import install_service
from computegroups.cli.status import list_components, status
from computegroups.cli.topo import topo


class Cgctl(click.Group):
    """`--json` may come after the command name too (`cgctl list --json`), as people type it.

    It is moved in front of the command before parsing, except after `--`,
    where it belongs to the worker's command.
    """

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
@click.version_option(package_name="computegroups", prog_name="cgctl")
@click.pass_context
def cli(ctx: click.Context, socket: str | None, simulate: str | None, json_output: bool) -> None:
    """Allocate GPUs and run workloads on them through cgd."""
    ctx.obj = CliContext(socket=socket, simulate=simulate or None, json=json_output)


cli.add_command(topo)
for command in (allocate, release, scale, restart, list_components, status, env, run, drain, reserve, logs,
                install_service, apply, delete, get):
    cli.add_command(command)


def main() -> None:
    """Run cgctl; usage mistakes get the same one-line form as other errors."""
    try:
        code = cli.main(prog_name="cgctl", standalone_mode=False)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "cgctl"
        click.echo(f"cgctl: error: {exc.format_message()} (see `{where} --help`)", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f"cgctl: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("cgctl: aborted", err=True)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)
