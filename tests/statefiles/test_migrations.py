"""Older state files are upgraded on load; the original is kept when the upgrade is first written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from computegroups.daemon.model.claims import Claim
from computegroups.daemon.model.requests import ComponentSpec
from computegroups.statefiles import (
    SCHEMA_VERSION,
    ComponentState,
    GroupState,
    Role,
    Scope,
    StateCorruptError,
    StateFormatError,
    StateStore,
)
from computegroups.statefiles.fileformat import encode_body, validated
from computegroups.statefiles.migrations import MIGRATIONS, migrate, migration
from computegroups.topology.model import DomainKind
from tests.statefiles.samples import UUIDS, edit, populated_doc


def version_0() -> dict[str, Any]:
    """The prototype's shape: drained GPUs by index, no deployments, no checksum."""
    data: dict[str, Any] = json.loads(msgspec.json.encode(populated_doc()))
    data["schema_version"] = 0
    data["generation"] = 41
    data["drained"] = [2, 0]
    del data["deployments"]
    for component in data["components"].values():
        del component["deployment"]
    return data


def test_version_1_keeps_the_replica_count_on_the_record_only() -> None:
    data: dict[str, Any] = json.loads(msgspec.json.encode(populated_doc()))
    data["schema_version"] = 1
    data["components"]["web"]["spec"]["replicas"] = 7
    migrated = migrate(data)
    assert "replicas" not in migrated["components"]["web"]["spec"]
    assert migrated["components"]["web"]["replicas"] == 2


def test_every_older_version_has_a_step_to_the_next() -> None:
    assert sorted(MIGRATIONS) == list(range(SCHEMA_VERSION))


def test_version_0_names_drained_gpus_by_uuid_and_gains_deployments() -> None:
    data = migrate(version_0())
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["drained"] == [UUIDS[2], UUIDS[0]]
    assert data["deployments"] == {}
    assert data["components"]["web"]["deployment"] is None


def test_a_version_0_file_loads_and_its_original_is_kept_on_the_first_write(store: StateStore) -> None:
    store.directory.mkdir(parents=True)
    original = json.dumps(version_0(), indent=2).encode()
    store.path.write_bytes(original)
    doc = store.load()
    assert (doc.schema_version, doc.generation, doc.drained) == (SCHEMA_VERSION, 41, (UUIDS[2], UUIDS[0]))
    with (txn := store.transaction()):
        pass
    assert txn.written, "a migrated state is written even when nothing else changed"
    assert (store.directory / "state.json.v0").read_bytes() == original
    assert store.backup_path.read_bytes() == original
    rewritten = json.loads(store.path.read_bytes())
    assert rewritten["schema_version"] == SCHEMA_VERSION and rewritten["generation"] == 42
    with (again := store.transaction()):
        pass
    assert not again.written


@pytest.mark.parametrize(
    ("drained", "machine", "message"),
    [
        ([7], True, r"drained\[0\]: GPU index 7 is not in machine.gpu_uuids \(4 GPUs\)"),
        ([0], False, r"drained\[0\]: GPU index 0 is not in machine.gpu_uuids \(0 GPUs\)"),
        (["GPU-aaaa"], True, r"drained\[0\]: expected a GPU index \(schema version 0\), got string"),
        ({}, True, r"drained: expected list of GPU indices"),
    ],
)
def test_a_version_0_file_that_cannot_be_migrated_is_unusable(drained: Any, machine: bool, message: str) -> None:
    data = version_0()
    data["drained"] = drained
    if not machine:
        data["machine"] = None
    with pytest.raises(StateFormatError, match=message):
        migrate(data)


def test_an_unmigratable_file_without_backup_is_a_refusal(store: StateStore) -> None:
    store.directory.mkdir(parents=True)
    data = version_0()
    data["drained"] = [9]
    store.path.write_text(json.dumps(data))
    with pytest.raises(StateCorruptError, match="GPU index 9"):
        store.load()


def test_a_version_older_than_any_migration_is_refused_clearly() -> None:
    with pytest.raises(StateFormatError, match="schema_version: -1 is older than any"):
        migrate({"schema_version": -1})


def test_a_second_migration_for_one_version_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="already registered"):
        migration(0)(lambda data: data)


RELEASE_0_1_0 = Path(__file__).parent / "fixtures" / "state-0.1.0.json"
"""Written by cgd 0.1.0 (the hand-written codec) on a simulated dgx-h100: shares, a shadow, a sharer,
a reservation, a drained GPU and a Grove deployment."""


def test_a_state_written_by_release_0_1_0_loads_and_commits_again(store: StateStore) -> None:
    store.directory.mkdir(parents=True)
    original = RELEASE_0_1_0.read_bytes()
    store.path.write_bytes(original)
    doc = store.load()
    assert (doc.schema_version, doc.generation) == (SCHEMA_VERSION, 14)
    assert doc.machine is not None and doc.machine.hostname == "dgx-h100-sim" and len(doc.machine.gpu_uuids) == 8
    assert doc.drained == ("GPU-160615ca-6772-548d-99fb-f3dfb61e08f4",)
    assert len(doc.components) == 11 and len(doc.groups) == 17 and len(doc.workers) == 11
    assert doc.components["web-standby"].shadow_of == "web"
    assert doc.components["web-standby"].spec == ComponentSpec(
        shadow_of="web", command=("python3", "-c", "import time; time.sleep(3600)"), cwd="/work/main")
    assert doc.components["rs-0-worker-a-standby"].deployment == "rs"
    assert doc.components["trainer"].state is ComponentState.ALLOCATED
    assert doc.components["small-a"].replicas == 2
    assert doc.groups["trainer-0"].users == ("side/0", "trainer/0"), "side shares trainer's group"
    assert doc.groups["trainer-0"].claim == Claim(gpus=2, colocate=DomainKind.NVLINK)
    assert [d.gpu_index for d in doc.groups["trainer-0"].devices] == [2, 3]
    share = doc.groups["rs-0-sga-0-rank"]
    assert (share.devices[0].memory_mib, share.devices[0].compute_pct, share.devices[0].whole) == (1024, 5, False)
    assert doc.groups["rs-all-set-pool"].scope is Scope.ALL_REPLICAS
    assert doc.groups["later-0"].state is GroupState.RESERVED
    assert doc.reservations["later"].group_ids == ("later-0",)
    assert doc.reservations["later"].spec.ttl_s == 3600.0
    assert doc.workers["web-standby/0"].role is Role.SHADOW and doc.workers["web/0"].pid == 5355
    assert doc.deployments["rs"].spec["file"]["name"] == "rs"

    with (first := store.transaction()):
        pass
    assert first.written and first.generation == 15, "a migrated state is written on the first transaction"
    assert (store.directory / "state.json.v1").read_bytes() == original
    rewritten = json.loads(store.path.read_bytes())
    assert rewritten["schema_version"] == SCHEMA_VERSION
    assert all("replicas" not in c["spec"] for c in rewritten["components"].values())

    with (txn := store.transaction()) as changed:
        edit(changed.groups, "web-0", state=GroupState.DRAINING)
    assert txn.written and txn.generation == 16
    reloaded = store.load()
    assert reloaded.groups["web-0"].state is GroupState.DRAINING
    edit(reloaded.groups, "web-0", state=GroupState.ALLOCATED)
    reloaded.generation = doc.generation
    assert reloaded == doc

    body = encode_body(reloaded)
    assert validated(reloaded.generation, body) == reloaded
