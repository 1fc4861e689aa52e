"""The rule for names: one place, standard library only.

A component, group, reservation or deployment name becomes part of file
names and group ids. cgctl checks a name it is given with this same rule
before sending it, without paying for the rest of the model at start-up.
"""

from __future__ import annotations

import re

NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
NAME_RE = re.compile(NAME_PATTERN[1:-1])
NAME_PROBLEM = ("{value} is not a valid name: use 1-63 lowercase letters, digits and '-', "
                "starting with a letter or digit")


def name_problem(value: str) -> str | None:
    """Why `value` is not a valid name, or None when it is."""
    return None if NAME_RE.fullmatch(value) else NAME_PROBLEM.format(value=repr(value[:80]))
