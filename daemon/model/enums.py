"""The closed choices shared by requests, the state file and the views.

Each is a `str` enum: members compare, hash, print and encode as their
value, so `state == "lost"`, f-strings and JSON keep working while the type
checker sees the closed set. (`enum.StrEnum` does this from Python 3.11;
the package still runs on 3.10.)
"""

from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    def __str__(self) -> str:
        return str.__str__(self)


class Scope(StrEnum):
    """One compute group per replica of the owner, or one that every replica shares."""

    PER_REPLICA = "per-replica"
    ALL_REPLICAS = "all-replicas"


class Role(StrEnum):
    PRIMARY = "primary"
    SHADOW = "shadow"


class GroupState(StrEnum):
    RESERVED = "reserved"
    ALLOCATED = "allocated"
    DRAINING = "draining"
    DEGRADED = "degraded"
    LOST = "lost"


class ComponentState(StrEnum):
    ALLOCATED = "allocated"
    """Holds its groups and runs nothing (no command)."""
    RUNNING = "running"
    DEGRADED = "degraded"
    """One of its groups is on a GPU that became unhealthy."""
    FAILED = "failed"
    """A replica ran out of restarts."""
    LOST = "lost"
    """Its groups' GPUs left the machine."""
    RELEASING = "releasing"
    """Its workers are being stopped; the record goes once they have."""
