"""The one source of truth on disk: locked, crash-safe state files.

Only the manager writes them (through `StateStore.transaction()`); tools may
read them with `StateStore.load()`. The format and the guarantees are
described in docs/state-files.md.
"""

from computegroups.daemon.model.enums import ComponentState, GroupState, Role, Scope
from computegroups.statefiles.errors import (
    StateCorruptError,
    StateError,
    StateFormatError,
    StateLockedError,
    StateVersionError,
)
from computegroups.statefiles.paths import default_state_dir, resolve_state_dir
from computegroups.statefiles.schema import (
    SCHEMA_VERSION,
    ComponentRecord,
    DeploymentRecord,
    DeviceRecord,
    GroupRecord,
    MachineFingerprint,
    ReservationRecord,
    StateDoc,
    WorkerRecord,
    worker_key,
)
from computegroups.statefiles.store import StateStore, Transaction, mark_lost, missing_gpus

__all__ = [
    "SCHEMA_VERSION",
    "ComponentRecord",
    "ComponentState",
    "DeploymentRecord",
    "DeviceRecord",
    "GroupRecord",
    "GroupState",
    "MachineFingerprint",
    "ReservationRecord",
    "Role",
    "Scope",
    "StateCorruptError",
    "StateDoc",
    "StateError",
    "StateFormatError",
    "StateLockedError",
    "StateStore",
    "StateVersionError",
    "Transaction",
    "WorkerRecord",
    "default_state_dir",
    "mark_lost",
    "missing_gpus",
    "resolve_state_dir",
    "worker_key",
]
