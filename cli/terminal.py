"""How wide cgctl's text may be: the terminal's width on a terminal, 80 columns elsewhere.

A pipe or a file is read later, by someone at a terminal of any size, so
it gets the width every terminal has; a terminal gets its own, so a wide
one shows more and a narrow one never wraps a line.
"""

from __future__ import annotations

import shutil
import sys

WIDTH = 80


def columns() -> int:
    """The columns a line of cgctl's text may take on stdout."""
    if not sys.stdout.isatty():
        return WIDTH
    return max(1, shutil.get_terminal_size((WIDTH, 24)).columns)
