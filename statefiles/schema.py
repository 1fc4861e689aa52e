"""The records kept in the state file, and their strict JSON form.

They are plain mutable dataclasses: inside a transaction the manager changes
them in place (`doc.groups[gid].state = "draining"`) or with
`dataclasses.replace`, and the store validates the whole document with
`StateDoc.from_dict(doc.to_dict())` before anything reaches the disk, so a
wrong value is refused at commit with its JSON path instead of being
persisted. Sequences are tuples so two records never share a list by accident.
Fields typed `dict[str, Any]` (specs, claims) are opaque JSON objects that
the manager validates itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from computegroups.statefiles.codec import Invalid, check_choices, check_range, from_json, key_step, to_json

SCHEMA_VERSION = 1
"""The version this code writes. Older files are migrated on load (see `migrations.py`)."""

GROUP_STATES = ("reserved", "allocated", "draining", "degraded", "lost")
SCOPES = ("all-replicas", "per-replica")
ROLES = ("primary", "shadow")

R = TypeVar("R", bound="Record")


class Record:
    """JSON conversion shared by every record; subclasses are dataclasses."""

    __slots__ = ()

    @classmethod
    def from_dict(cls: type[R], data: Any, path: str = "") -> R:
        """Refuses unknown keys, missing keys and wrong types with a `StateFormatError` naming the path."""
        return from_json(cls, data, path)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form; opaque objects (specs, claims) are shared with the record, not copied."""
        result: dict[str, Any] = to_json(self)
        return result


def _now() -> float:
    return time.time()


@dataclass(slots=True, kw_only=True)
class MachineFingerprint(Record):
    """The box the state was written on: a GPU UUID missing from today's machine means its groups are lost."""

    hostname: str
    gpu_uuids: tuple[str, ...]

    def _validate(self) -> None:
        _unique(self.gpu_uuids, ".gpu_uuids")


@dataclass(slots=True, kw_only=True)
class ComponentRecord(Record):
    name: str
    owner_uid: int = field(metadata=check_range(0))
    owner_gid: int = field(metadata=check_range(0))
    spec: dict[str, Any]
    replicas: int = field(metadata=check_range(0))
    state: str
    deployment: str | None = None
    shadow_of: str | None = None
    lease_pid: int | None = field(default=None, metadata=check_range(1))
    """A client process whose death releases the component (with `lease_start` against pid reuse)."""
    lease_start: float | None = None
    created: float = field(default_factory=_now)


@dataclass(slots=True, kw_only=True)
class DeviceRecord(Record):
    gpu_index: int = field(metadata=check_range(0))
    gpu_uuid: str
    mig_uuid: str | None = None
    memory_mib: int = field(metadata=check_range(0))
    compute_pct: int = field(metadata=check_range(0, 100))
    whole: bool


@dataclass(slots=True, kw_only=True)
class GroupRecord(Record):
    id: str
    claim: dict[str, Any]
    devices: tuple[DeviceRecord, ...]
    state: str = field(metadata=check_choices(*GROUP_STATES))
    owner: str
    """The component, reservation or deployment path that created the group."""
    owner_uid: int = field(metadata=check_range(0))
    owner_gid: int = field(metadata=check_range(0))
    users: tuple[str, ...] = ()
    """Components (or their replicas) attached to the group; its capacity is counted once for all of them."""
    scope: str = field(metadata=check_choices(*SCOPES))
    replica: int | None = field(default=None, metadata=check_range(0))
    domain: tuple[int, ...] | None = field(default=None, metadata=check_range(0))
    exclusive_domain: tuple[int, ...] | None = field(default=None, metadata=check_range(0))
    priority: int = 0
    created: float = field(default_factory=_now)
    explanation: str = ""

    def _validate(self) -> None:
        _unique(self.users, ".users")


@dataclass(slots=True, kw_only=True)
class ReservationRecord(Record):
    name: str
    owner_uid: int = field(metadata=check_range(0))
    owner_gid: int = field(metadata=check_range(0))
    group_ids: tuple[str, ...]
    spec: dict[str, Any]
    expires_at: float
    priority: int = 0

    def _validate(self) -> None:
        _unique(self.group_ids, ".group_ids")


@dataclass(slots=True, kw_only=True)
class WorkerRecord(Record):
    component: str
    replica: int = field(metadata=check_range(0))
    role: str = field(metadata=check_choices(*ROLES))
    pid: int | None = field(default=None, metadata=check_range(1))
    create_time: float | None = None
    """psutil's `Process.create_time()` of `pid`: a reused pid has another one, so it is never taken for ours."""
    started_at: float = field(default_factory=_now)
    restarts: int = field(default=0, metadata=check_range(0))
    promotions: int = field(default=0, metadata=check_range(0))
    last_promoted_at: float | None = None

    @property
    def key(self) -> str:
        """The key of this worker in `StateDoc.workers`."""
        return worker_key(self.component, self.replica)

    def _validate(self) -> None:
        if self.pid is not None and self.create_time is None:
            raise Invalid("required with a pid, or a reused pid could be taken for this worker", ".create_time")


@dataclass(slots=True, kw_only=True)
class DeploymentRecord(Record):
    name: str
    owner_uid: int = field(metadata=check_range(0))
    owner_gid: int = field(metadata=check_range(0))
    spec: dict[str, Any]
    source: str | None = None


@dataclass(slots=True, kw_only=True)
class StateDoc(Record):
    """Everything the daemon must not lose. `StateDoc()` is the empty state of a new machine."""

    schema_version: int = SCHEMA_VERSION
    generation: int = field(default=0, metadata=check_range(0))
    """Bumped by the store on every commit; the manager never sets it."""
    machine: MachineFingerprint | None = None
    components: dict[str, ComponentRecord] = field(default_factory=dict)
    groups: dict[str, GroupRecord] = field(default_factory=dict)
    reservations: dict[str, ReservationRecord] = field(default_factory=dict)
    drained: tuple[str, ...] = ()
    """UUIDs of GPUs that get nothing new."""
    workers: dict[str, WorkerRecord] = field(default_factory=dict)
    deployments: dict[str, DeploymentRecord] = field(default_factory=dict)

    def _validate(self) -> None:
        if self.schema_version != SCHEMA_VERSION:
            raise Invalid(f"must be {SCHEMA_VERSION} once loaded, got {self.schema_version}", ".schema_version")
        _unique(self.drained, ".drained")
        _keyed(self.components, ".components", "name", lambda r: r.name)
        _keyed(self.groups, ".groups", "id", lambda r: r.id)
        _keyed(self.reservations, ".reservations", "name", lambda r: r.name)
        _keyed(self.deployments, ".deployments", "name", lambda r: r.name)
        _keyed(self.workers, ".workers", "<component>/<replica>", lambda r: r.key)


def worker_key(component: str, replica: int) -> str:
    """`"<component>/<replica>"`, the key of a worker in `StateDoc.workers`.

    The role is not part of it: a promotion swaps roles, and a key that
    changed with them would have to be moved in the middle of a failover.
    """
    return f"{component}/{replica}"


def _unique(values: tuple[Any, ...], step: str) -> None:
    seen = set()
    for index, value in enumerate(values):
        if value in seen:
            raise Invalid(f"duplicate {value!r}", step, f"[{index}]")
        seen.add(value)


def _keyed(records: dict[str, Any], step: str, what: str, key_of: Callable[[Any], str]) -> None:
    for key, record in records.items():
        if key_of(record) != key:
            raise Invalid(f"{what} must match the key {key!r}, got {key_of(record)!r}", step, key_step(key))
