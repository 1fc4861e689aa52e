"""What every cgctl command gets from the global options.

Frozen so a command cannot change what the next one sees; the attribute
names (`socket`, `simulate`, `json`) are the ones `computegroups.cli.connect` reads.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CliContext:
    socket: str | None = None
    simulate: str | None = None
    json: bool = False
