"""The records kept in the state file: msgspec Structs, strict on decode.

They are frozen values: inside a transaction the manager changes a record
by putting a new one in its place (`doc.groups[gid] = replace(group,
state=GroupState.DRAINING)`), never in place. So a commit finds what
changed by identity (see journal.py) and documents share the records they
have in common, and a document kept from before a change (to undo it) still
says what it said. The store validates each changed record by decoding the
very bytes it is about to write, so a wrong value is refused at commit with
its JSON path instead of being persisted. Sequences are tuples so two
records never share a list by accident; the maps inside a record (an
environment, a deployment's file) are never changed in place either.

The rules that span fields (unique lists, map keys that match the record's
name, a pid only with its start time) are small functions called from
`__post_init__`, which msgspec runs on every decode; they raise `RuleBroken`
with the steps below the record, and `validation.py` turns that into the
usual `groups["g1"].users[1]: duplicate 'web'`.

A component's, group's and reservation's own description (`spec`, `claim`)
is the request model itself (`daemon/model`): decoded and checked once when
the state is read, and used as it is everywhere after.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Annotated, Any, TypeVar

import msgspec

from computegroups.daemon.model.claims import Claim
from computegroups.daemon.model.enums import ComponentState, GroupState, Outcome, Role, Scope
from computegroups.daemon.model.requests import ComponentSpec, ReservationSpec

SCHEMA_VERSION = 3
"""The version this code writes. Older files are migrated on load (see `migrations.py`)."""

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Pid = Annotated[int, msgspec.Meta(ge=1)]
Percent = Annotated[int, msgspec.Meta(ge=0, le=100)]


class RuleBroken(ValueError):
    """A rule that spans fields, broken; `steps` lead from the record to the offending value (`.users`, `[1]`).

    Raised in `__post_init__`: msgspec reports it as a `ValidationError` at
    the record's path and keeps this exception as its `__cause__`.
    """

    def __init__(self, problem: str, *steps: str) -> None:
        super().__init__(f"{''.join(steps).lstrip('.')}: {problem}" if steps else problem)
        self.problem = problem
        self.steps = steps


class Record(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Every record: unknown and missing keys are refused; frozen.

    Each subclass says `kw_only=True` itself (msgspec applies it to the
    fields a class defines), so required and defaulted fields can keep the
    order of the file.
    """


class MachineFingerprint(Record, frozen=True, kw_only=True):
    """The box the state was written on: a GPU UUID missing from today's machine means its groups are lost."""

    hostname: str
    gpu_uuids: tuple[str, ...]

    def __post_init__(self) -> None:
        _unique(self.gpu_uuids, ".gpu_uuids")


class ComponentRecord(Record, frozen=True, kw_only=True):
    name: str
    owner_uid: NonNegative
    owner_gid: NonNegative
    spec: ComponentSpec
    replicas: NonNegative
    state: ComponentState
    deployment: str | None = None
    shadow_of: str | None = None
    lease_pid: Pid | None = None
    """A client process whose death releases the component (with `lease_start` against pid reuse)."""
    lease_start: float | None = None
    created: float = msgspec.field(default_factory=time.time)
    queued_at: float | None = None
    """While `pending`: when it was queued, its place within its priority (first come, first served)."""
    pending_reason: str = ""
    """While `pending`: why its claim does not fit now, in the placement engine's words."""
    waiter_pid: Pid | None = None
    """While `pending`: the client blocked in `--wait`; a queued claim whose waiter is gone is dropped."""
    waiter_start: float | None = None
    ended_at: float | None = None
    """When its last replica ended for good (`completed`, `failed`, `timeout`): the retention counts from here."""


class DeviceRecord(Record, frozen=True, kw_only=True):
    gpu_index: NonNegative
    gpu_uuid: str
    mig_uuid: str | None = None
    memory_mib: NonNegative
    compute_pct: Percent
    whole: bool


class GroupRecord(Record, frozen=True, kw_only=True):
    id: str
    claim: Claim
    devices: tuple[DeviceRecord, ...]
    state: GroupState
    owner: str
    """The component, reservation or deployment path that created the group."""
    owner_uid: NonNegative
    owner_gid: NonNegative
    users: tuple[str, ...] = ()
    """Components (or their replicas) attached to the group; its capacity is counted once for all of them."""
    scope: Scope
    replica: NonNegative | None = None
    domain: tuple[NonNegative, ...] | None = None
    exclusive_domain: tuple[NonNegative, ...] | None = None
    priority: int = 0
    created: float = msgspec.field(default_factory=time.time)
    explanation: str = ""

    def __post_init__(self) -> None:
        _unique(self.users, ".users")

    @property
    def standalone(self) -> bool:
        """Made by `POST /v1/groups` (owner `@uid`): nobody's until a component attaches by its id."""
        return self.owner.startswith("@")


class ReservationRecord(Record, frozen=True, kw_only=True):
    name: str
    owner_uid: NonNegative
    owner_gid: NonNegative
    group_ids: tuple[str, ...]
    spec: ReservationSpec
    expires_at: float
    priority: int = 0

    def __post_init__(self) -> None:
        _unique(self.group_ids, ".group_ids")


class WorkerRecord(Record, frozen=True, kw_only=True):
    component: str
    replica: NonNegative
    role: Role
    pid: Pid | None = None
    create_time: float | None = None
    """psutil's `Process.create_time()` of `pid`: a reused pid has another one, so it is never taken for ours."""
    started_at: float = msgspec.field(default_factory=time.time)
    restarts: NonNegative = 0
    promotions: NonNegative = 0
    last_promoted_at: float | None = None
    exit_code: int | None = None
    """The status of its last run as the kernel gave it: negative for a signal (-9: SIGKILL)."""
    ended_at: float | None = None
    outcome: Outcome | None = None
    """How the replica ended for good; None while it runs or will run again."""

    @property
    def key(self) -> str:
        """The key of this worker in `StateDoc.workers`."""
        return worker_key(self.component, self.replica)

    def __post_init__(self) -> None:
        if self.pid is not None and self.create_time is None:
            raise RuleBroken("required with a pid, or a reused pid could be taken for this worker", ".create_time")


class DeploymentRecord(Record, frozen=True, kw_only=True):
    name: str
    owner_uid: NonNegative
    owner_gid: NonNegative
    spec: dict[str, Any]
    """The deployment file as applied and scaled, in its canonical JSON form (`DeploymentSpec.to_dict`).

    Kept as the user's document, not re-encoded from the model: the file's
    form tells a field left out from one given with its default value."""
    source: str | None = None


class StateDoc(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Everything the daemon must not lose. `StateDoc()` is the empty state of a new machine.

    Not frozen: a transaction hands over a document whose maps are its own
    to change, and the store sets its generation."""

    schema_version: int = SCHEMA_VERSION
    generation: NonNegative = 0
    """Bumped by the store on every commit; the manager never sets it."""
    machine: MachineFingerprint | None = None
    components: dict[str, ComponentRecord] = {}
    groups: dict[str, GroupRecord] = {}
    reservations: dict[str, ReservationRecord] = {}
    drained: tuple[str, ...] = ()
    """UUIDs of GPUs that get nothing new."""
    workers: dict[str, WorkerRecord] = {}
    deployments: dict[str, DeploymentRecord] = {}

    def __post_init__(self) -> None:
        if self.schema_version != SCHEMA_VERSION:
            raise RuleBroken(f"must be {SCHEMA_VERSION} once loaded, got {self.schema_version}", ".schema_version")
        _unique(self.drained, ".drained")
        _keyed(self.components, ".components", "name", _name)
        _keyed(self.groups, ".groups", "id", _id)
        _keyed(self.reservations, ".reservations", "name", _name)
        _keyed(self.deployments, ".deployments", "name", _name)
        _keyed(self.workers, ".workers", "<component>/<replica>", _key)


def worker_key(component: str, replica: int) -> str:
    """`"<component>/<replica>"`, the key of a worker in `StateDoc.workers`.

    The role is not part of it: a promotion swaps roles, and a key that
    changed with them would have to be moved in the middle of a failover.
    """
    return f"{component}/{replica}"


def key_step(key: str) -> str:
    """A mapping key as it appears in an error path: `["g1"]`."""
    return f"[{json.dumps(key, ensure_ascii=False)}]"


def _unique(values: Sequence[Hashable], step: str) -> None:
    if len(set(values)) == len(values):
        return
    seen = set()
    for index, value in enumerate(values):
        if value in seen:
            raise RuleBroken(f"duplicate {value!r}", step, f"[{index}]")
        seen.add(value)


R = TypeVar("R")


def _keyed(records: dict[str, R], step: str, what: str, key_of: Callable[[R], str]) -> None:
    """Every record under its own key; the map is kept in key order, as the file lists it.

    So a state iterates the same way whether it was just committed or loaded
    from a file someone edited by hand.
    """
    for key, record in records.items():
        if key_of(record) != key:
            raise RuleBroken(f"{what} must match the key {key!r}, got {key_of(record)!r}", step, key_step(key))
    keys = list(records)
    ordered = sorted(keys)
    if keys != ordered:
        items = [(key, records[key]) for key in ordered]
        records.clear()
        records.update(items)


def _name(record: ComponentRecord | ReservationRecord | DeploymentRecord) -> str:
    return record.name


def _id(record: GroupRecord) -> str:
    return record.id


def _key(record: WorkerRecord) -> str:
    return record.key
