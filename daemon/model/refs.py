"""Names of replicas, parsed and formatted in one place.

A replica is written `component/index` in a group's users and as the key of
the worker table; splitting that string by hand at every use is how a name
with an unexpected character would once have been read two ways.
"""

from __future__ import annotations

from typing import NamedTuple


class ReplicaRef(NamedTuple):
    component: str
    replica: int

    @classmethod
    def parse(cls, text: str) -> ReplicaRef:
        """The inverse of `str(ref)`; component names never contain `/`, so the last one splits."""
        component, sep, index = text.rpartition("/")
        if not sep or not component or not index.isdigit():
            raise ValueError(f"not a replica reference (component/index): {text!r}")
        return cls(component, int(index))

    def __str__(self) -> str:
        return f"{self.component}/{self.replica}"


def component_of(text: str) -> str:
    """The component of a stored replica reference."""
    return ReplicaRef.parse(text).component


def uses(users: tuple[str, ...], component: str) -> bool:
    """Whether one of `component`'s replicas is among a group's `users`.

    Component names never contain `/`, so a prefix test says exactly what
    `component_of(u) == component` would, without parsing every reference
    of every group: this runs over the whole state on each release.
    """
    prefix = f"{component}/"
    return any(u.startswith(prefix) for u in users)
