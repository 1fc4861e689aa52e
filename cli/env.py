"""`cgctl env`: a replica's environment as shell lines, for `eval "$(cgctl env web)"`."""

from __future__ import annotations

import shlex

import click

from computegroups.cli.connect import (
    client,
    complete_components,
    emit_json,
    emit_lines,
    json_wanted,
    talking,
)
from computegroups.cli.options import NAME


@click.command()
@click.argument("name", type=NAME, shell_complete=complete_components)
@click.option("--replica", type=click.IntRange(min=0), default=0, show_default=True)
def env(name: str, replica: int) -> None:
    """Print `export` lines with the environment of NAME's replica."""
    with talking():
        doc = client().component_env(name, replica)
    if json_wanted():
        emit_json(doc)
    else:
        emit_lines([f"export {key}={shlex.quote(value)}" for key, value in sorted(doc["env"].items())])
