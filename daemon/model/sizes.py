"""The rule for memory sizes: one place, standard library only.

A share's `memory_mib` may be written as a size ("20GiB") on the wire, in
the configuration and on cgctl's command line. cgctl checks a size it is
given with this same rule before sending it, without paying for the rest of
the model (msgspec and every struct) at start-up.
"""

from __future__ import annotations

import math
import re

_UNIT_MIB = {"": 1, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
_SIZE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(?:([kmgt])(?:i?b)?)?\s*", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """A memory size in MiB.

    A bare number is MiB. Units are binary whatever their spelling: `20G`,
    `20GB` and `20GiB` are all 20480 MiB, because GPU memory is sold in
    "GB" that are GiB and nobody means 10^9 bytes when sizing a share.
    Fractions round up to the next MiB so a share is never smaller than asked.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        mib = text
    else:
        match = _SIZE_RE.fullmatch(text) if isinstance(text, str) else None
        if not match:
            raise ValueError(f"not a size: {text!r} (use a number of MiB or units MiB/GiB/TiB, e.g. '20GiB')")
        mib = math.ceil(float(match.group(1)) * _UNIT_MIB[(match.group(2) or "").lower()])
    if mib < 1:
        raise ValueError(f"a size must be at least 1 MiB, got {text!r}")
    return mib
