"""Sample states shared by the state file tests."""

from __future__ import annotations

import copy
from typing import Any, TypeVar

import msgspec

from computegroups.daemon.model.claims import Claim
from computegroups.daemon.model.enums import ComponentState, GroupState, Role, Scope
from computegroups.daemon.model.requests import ComponentSpec, ReservationSpec
from computegroups.statefiles import (
    ComponentRecord,
    DeploymentRecord,
    DeviceRecord,
    GroupRecord,
    MachineFingerprint,
    ReservationRecord,
    StateDoc,
    StateStore,
    WorkerRecord,
)

UUIDS = ("GPU-aaaa", "GPU-bbbb", "GPU-cccc", "GPU-dddd")
R = TypeVar("R", bound=msgspec.Struct)


def broken(records: dict[str, R], key: str, **fields: Any) -> None:
    """Put a copy of `records[key]` with `fields` set past its rules, as a bug in the manager would."""
    bad = copy.copy(records[key])
    for name, value in fields.items():
        msgspec.structs.force_setattr(bad, name, value)
    records[key] = bad


def edit(records: dict[str, R], key: str, **fields: Any) -> R:
    """Put a changed copy of `records[key]` in its place, as the manager changes a frozen record."""
    records[key] = new = msgspec.structs.replace(records[key], **fields)
    return new


def populated_doc() -> StateDoc:
    """One record of every kind, with the optional fields set, so round trips cover them all."""
    web = ComponentRecord(
        name="web", owner_uid=1000, owner_gid=100, replicas=2, state=ComponentState.RUNNING,
        deployment="site", spec=ComponentSpec(command=("python", "serve.py"), env={"A": "1"}, cwd="/srv/web"),
        lease_pid=4242, lease_start=1700000000.25, created=1700000000.0,
    )
    standby = ComponentRecord(
        name="standby", owner_uid=1000, owner_gid=100, replicas=2, state=ComponentState.RUNNING,
        shadow_of="web", spec=ComponentSpec(shadow_of="web"), created=1700000001.0,
    )
    share = DeviceRecord(gpu_index=1, gpu_uuid=UUIDS[1], memory_mib=20000, compute_pct=25, whole=False)
    whole = DeviceRecord(gpu_index=0, gpu_uuid=UUIDS[0], memory_mib=81559, compute_pct=100, whole=True)
    mig = DeviceRecord(gpu_index=3, gpu_uuid=UUIDS[3], mig_uuid="MIG-1111", memory_mib=9984, compute_pct=14,
                       whole=True)
    groups = [
        GroupRecord(id="web-0", claim=Claim(gpus=1), devices=(whole,), state=GroupState.ALLOCATED, owner="web",
                    owner_uid=1000, owner_gid=100, users=("web/0", "standby/0"), scope=Scope.PER_REPLICA,
                    replica=0, domain=(0, 1), priority=5, created=1700000000.0,
                    explanation="GPU 0: free, NVLink to GPU 1"),
        GroupRecord(id="web-1", claim=Claim(memory_mib=20000, compute_pct=25), devices=(share,),
                    state=GroupState.DRAINING,
                    owner="web", owner_uid=1000, owner_gid=100, users=("web/1",), scope=Scope.PER_REPLICA, replica=1,
                    exclusive_domain=(1,), created=1700000000.0),
        GroupRecord(id="night-0", claim=Claim(mig="1g.10gb"), devices=(mig,), state=GroupState.RESERVED,
                    owner="night", owner_uid=1000, owner_gid=100, scope=Scope.ALL_REPLICAS, created=1700000002.0),
    ]
    return StateDoc(
        generation=0,
        machine=MachineFingerprint(hostname="box", gpu_uuids=UUIDS),
        components={"web": web, "standby": standby},
        groups={g.id: g for g in groups},
        reservations={"night": ReservationRecord(name="night", owner_uid=1000, owner_gid=100, group_ids=("night-0",),
                                                 spec=ReservationSpec(claim=Claim(mig="1g.10gb")),
                                                 expires_at=1700090000.0,
                                                 priority=1)},
        drained=(UUIDS[2],),
        workers={
            "web/0": WorkerRecord(component="web", replica=0, role=Role.PRIMARY, pid=5001,
                                          create_time=1700000000.5, started_at=1700000000.5, restarts=2),
            "standby/0": WorkerRecord(component="standby", replica=0, role=Role.SHADOW, started_at=1700000001.0,
                                             promotions=1, last_promoted_at=1700000100.0),
        },
        deployments={"site": DeploymentRecord(name="site", owner_uid=1000, owner_gid=100, spec={"components": []},
                                              source="/home/ada/site.toml")},
    )


def commit(store: StateStore, doc: StateDoc) -> StateDoc:
    """Replace the whole state with `doc` in one transaction; returns what was committed."""
    with (txn := store.transaction()):
        txn.doc = doc
    assert txn.committed is not None
    return txn.committed
