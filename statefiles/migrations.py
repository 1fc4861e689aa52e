"""Upgrades of state files written by older versions of computegroups.

A daemon upgraded in place must start with the allocations it had, so each
schema change comes with a step from version N to N+1; `migrate` chains them
on the parsed JSON before the strict validation of the current schema.
Steps get a fresh top-level dict they may change, and never see a file newer
than their target.

Version 0 (the prototype) had no `deployments`, no `deployment` on a
component, no checksum, and kept `drained` as GPU indices, which silently
pointed at the wrong GPU once the cards were reordered.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from computegroups.statefiles.errors import StateFormatError
from computegroups.statefiles.schema import SCHEMA_VERSION
from computegroups.statefiles.validation import describe

Migration = Callable[[dict[str, Any]], dict[str, Any]]

MIGRATIONS: dict[int, Migration] = {}
"""Step from the key's version to the next one."""


def migration(from_version: int) -> Callable[[Migration], Migration]:
    """Register the step that upgrades a document from `from_version` to `from_version + 1`."""

    def register(step: Migration) -> Migration:
        if from_version in MIGRATIONS:
            raise ValueError(f"a migration from schema version {from_version} is already registered")
        MIGRATIONS[from_version] = step
        return step

    return register


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    """Bring a document of an older schema version to `SCHEMA_VERSION`."""
    version = data["schema_version"]
    while version < SCHEMA_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:
            raise StateFormatError(
                f"schema_version: {version} is older than any this computegroups can migrate; "
                "upgrade through an intermediate release first"
            )
        data = step(dict(data))
        data["schema_version"] = version = version + 1
    return data


@migration(0)
def _drained_by_uuid(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 names drained GPUs by UUID and adds deployments."""
    machine = data.get("machine")
    uuids = machine.get("gpu_uuids") if isinstance(machine, dict) else None
    drained = data.get("drained", [])
    if not isinstance(drained, list):
        raise StateFormatError(f"drained: expected list of GPU indices (schema version 0), got {describe(drained)}")
    by_uuid = []
    for position, index in enumerate(drained):
        if type(index) is not int:
            raise StateFormatError(
                f"drained[{position}]: expected a GPU index (schema version 0), got {describe(index)}"
            )
        if not isinstance(uuids, list) or not 0 <= index < len(uuids):
            known = len(uuids) if isinstance(uuids, list) else 0
            raise StateFormatError(
                f"drained[{position}]: GPU index {index} is not in machine.gpu_uuids ({known} GPUs), "
                "so it can not be turned into a UUID"
            )
        by_uuid.append(uuids[index])
    data["drained"] = by_uuid
    data.setdefault("deployments", {})
    components = data.get("components")
    if isinstance(components, dict):
        data["components"] = {
            name: {"deployment": None, **record} if isinstance(record, dict) else record
            for name, record in components.items()
        }
    return data


@migration(1)
def _replicas_only_on_the_record(data: dict[str, Any]) -> dict[str, Any]:
    """Version 2 keeps a component's replica count on its record only.

    Version 1 also kept the count asked at allocation inside the component's
    `spec`, a second copy that every scale had to rewrite by hand; the
    record's `replicas` was always the one the daemon acted on.
    """
    components = data.get("components")
    if isinstance(components, dict):
        for record in components.values():
            spec = record.get("spec") if isinstance(record, dict) else None
            if isinstance(spec, dict):
                spec.pop("replicas", None)
    return data


@migration(2)
def _journal(data: dict[str, Any]) -> dict[str, Any]:
    """Version 3 keeps changes in a journal beside the snapshot (see journal.py); the document is unchanged.

    The version changes so that an older computegroups, which would read
    the snapshot and not the journal, refuses the state instead of losing
    every change since the snapshot.
    """
    return data
