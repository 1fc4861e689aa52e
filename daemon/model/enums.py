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


class RestartMode(StrEnum):
    """When a worker that ended on its own is started again (docker's and systemd's policies)."""

    ALWAYS = "always"
    """Whatever its exit status: a service."""
    ON_FAILURE = "on-failure"
    """Unless it exited 0: a job, retried when it crashes."""
    NEVER = "never"
    """Never: a job that runs once."""


class Outcome(StrEnum):
    """How a replica ended for good."""

    COMPLETED = "completed"
    """It exited 0 under `on-failure` or `never`."""
    FAILED = "failed"
    """It ran out of restarts, or failed under `never`, or could not start."""
    TIMEOUT = "timeout"
    """It was still running at its component's time limit."""


class ComponentState(StrEnum):
    PENDING = "pending"
    """Queued: its claim does not fit yet; it holds nothing and runs nothing."""
    ALLOCATED = "allocated"
    """Holds its groups and runs nothing (no command)."""
    RUNNING = "running"
    DEGRADED = "degraded"
    """One of its groups is on a GPU that became unhealthy."""
    FAILED = "failed"
    """A replica ran out of restarts (or failed under `never`); with every replica ended, its groups are freed."""
    COMPLETED = "completed"
    """Every replica exited 0 under `on-failure` or `never`; its groups are freed."""
    TIMEOUT = "timeout"
    """It was stopped at its time limit; its groups are freed."""
    LOST = "lost"
    """Its groups' GPUs left the machine."""
    RELEASING = "releasing"
    """Its workers are being stopped; the record goes once they have."""


class CpuBind(StrEnum):
    """Which CPUs a worker runs on: those local to its GPUs (NVML's CPU affinity), or any."""

    NUMA = "numa"
    NONE = "none"
