"""`cgctl drain`: stop new work landing on a GPU (before maintenance)."""

from __future__ import annotations

import click

from computegroups.cli.connect import client, emit_json, emit_lines, json_wanted, talking
from computegroups.cli.render import wrap
from computegroups.cli.terminal import columns


@click.command()
@click.argument("gpu", type=click.IntRange(min=0))
@click.option("--undrain", is_flag=True, help="Let new work land on it again.")
def drain(gpu: int, undrain: bool) -> None:
    """Drain GPU: nothing new is placed on it; what runs there keeps running."""
    with talking():
        doc = client().drain_gpu(gpu, drained=not undrain)
    if json_wanted():
        emit_json(doc)
        return
    groups = doc.get("groups") or []
    if undrain:
        emit_lines([f"GPU {gpu} undrained: new work may land on it"])
    else:
        still = f"; still on it: {', '.join(groups)} (release or move them)" if groups else "; nothing runs on it"
        emit_lines(wrap(f"GPU {gpu} drained: nothing new lands on it{still}", columns()))
