"""What every cgctl command gets from the global options.

Immutable so a command cannot change what the next one sees; the attribute
names (`socket`, `simulate`, `json`) are the ones `computegroups.cli.connect`
reads. A NamedTuple rather than a dataclass: `typing` is loaded with click
anyway, `dataclasses` would be one more import on every start.
"""

from __future__ import annotations

from typing import NamedTuple


class CliContext(NamedTuple):
    socket: str | None = None
    simulate: str | None = None
    json: bool = False
    kubernetes: bool = False
    """`--kubernetes`: apply/get/delete/list go to a cluster (`context`, `namespace`), not to cgd."""
    context: str | None = None
    namespace: str | None = None
