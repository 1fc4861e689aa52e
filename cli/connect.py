"""The one door from a cgctl command to cgd, and the one way a command fails.

Every command reaches the daemon through `client()` and lets `ClientError`
out of `talking()`, so "cgd is not running", "you may not" and "it does
not fit" read the same everywhere: one line `cgctl: error: ...` on stderr
and exit status 1.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any, NoReturn

import click

from computegroups.cli.context import CliContext
from computegroups.daemon.client.errors import ClientError
from computegroups.daemon.client.sync import CgdClient


class Failed(click.ClickException):
    """A refused or failed operation: exit 1, one line that says what to do."""

    exit_code = 1

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"cgctl: error: {self.format_message()}", file=file, err=file is None)


def fail(message: str) -> NoReturn:
    raise Failed(message)


@contextmanager
def talking() -> Iterator[None]:
    """Turn the client's typed errors into cgctl's failure line."""
    try:
        yield
    except ClientError as exc:
        raise Failed(str(exc)) from None


def _options() -> CliContext:
    return click.get_current_context().find_object(CliContext) or CliContext()


def client() -> CgdClient:
    """A client on the socket of `--socket`, `$CG_SOCKET` or the default."""
    return CgdClient(_options().socket)


def complete_components(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """Your component names for shell completion; when cgd is down, none.

    Completion parses without running the group's callback, so the socket
    comes from the root's parameters rather than the CliContext.
    """
    try:
        found = CgdClient(ctx.find_root().params.get("socket"), timeout=2).list_components(os.getuid())
    except ClientError:
        return []
    return [c["name"] for c in found["components"] if c["name"].startswith(incomplete)]


def json_wanted() -> bool:
    return _options().json


def emit_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, sort_keys=True))


def emit_lines(lines: list[str]) -> None:
    click.echo("\n".join(lines))
