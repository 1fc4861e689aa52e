"""Group and reservation operations: reserve, free, create, delete, drain and undrain.

A part of `Manager` (see manager.py): every method runs on the manager's
state keeper and supervisor, and decides under its lock.
"""

from __future__ import annotations

import os
from typing import Any

from msgspec.structs import replace

from computegroups.daemon.core.jobs import Jobs
from computegroups.daemon.core.transactions import (
    Caller,
    check_affinity_targets,
    check_owner,
    drop_displaced,
    group_record,
    new_reservation,
    release_reservation,
)
from computegroups.daemon.core.views import group_view, reservation_view
from computegroups.daemon.model.claims import Claim
from computegroups.daemon.model.enums import ComponentState, GroupState, Scope
from computegroups.daemon.model.errors import Conflict, Forbidden, NotFound
from computegroups.daemon.model.refs import component_of, uses
from computegroups.daemon.model.requests import ReservationRequest


class Groups(Jobs):
    async def reserve(self, caller: Caller, request: ReservationRequest) -> dict[str, Any]:
        async with self.keeper.lock:
            self.check_idle(request.name)
            with self.keeper.transaction() as doc:
                self.check_queue(doc, request.claim)  # once taken, a reservation's component may run forever
                record = new_reservation(doc, self.keeper, request, caller)
            self.queue_soon()
            return reservation_view(self.doc, self.doc.reservations[record.name])

    async def unreserve(self, caller: Caller, name: str) -> dict[str, Any]:
        async with self.keeper.lock:
            return self.unreserve_locked(caller, name)

    def unreserve_locked(self, caller: Caller, name: str) -> dict[str, Any]:
        """`unreserve` for a caller that holds the lock since it looked (no process to stop)."""
        res = self.doc.reservations.get(name)
        if res is None:
            raise NotFound(f"no reservation named {name!r}")
        check_owner(caller, res.owner_uid, f"reservation {name!r}")
        with self.keeper.transaction() as doc:
            groups = release_reservation(doc, name)
        return {"released": name, "groups": groups}

    async def create_group(self, caller: Caller, claim: Claim) -> dict[str, Any]:
        async with self.keeper.lock:
            with self.keeper.transaction() as doc:
                check_affinity_targets(doc, claim)
                self.check_queue(doc, claim)
                n = max([int(g.split(".", 1)[1]) for g in doc.groups if g.startswith("group.")] + [0]) + 1
                gid = f"group.{n}"
                (placement,) = self.keeper.place(doc, claim, [gid], f"@{caller.uid}")
                drop_displaced(doc, (placement,))
                doc.groups[gid] = group_record(
                    self.keeper.machine, placement, claim, owner=f"@{caller.uid}",
                    owner_uid=caller.uid, owner_gid=caller.gid, users=(), scope=Scope.ALL_REPLICAS,
                    replica=None, state=GroupState.ALLOCATED, created=self.keeper.clock(),
                )
            self.queue_soon()
            return group_view(self.doc, self.doc.groups[gid])

    async def delete_group(self, caller: Caller, gid: str) -> dict[str, Any]:
        async with self.keeper.lock:
            return self.delete_group_locked(caller, gid)

    def delete_group_locked(self, caller: Caller, gid: str) -> dict[str, Any]:
        """`delete_group` for a caller that holds the lock since it looked (no process to stop)."""
        g = self.group_record(gid)
        check_owner(caller, g.owner_uid, f"group {gid!r}")
        if not g.standalone:
            raise Conflict(f"group {gid!r} belongs to {g.owner!r}: release that instead")
        if g.users:
            users = sorted({component_of(u) for u in g.users})
            raise Conflict(f"group {gid!r} is in use by {', '.join(repr(u) for u in users)} "
                           f"({', '.join(g.users)}): release {'it' if len(users) == 1 else 'them'} first")
        with self.keeper.transaction() as doc:
            del doc.groups[gid]
        return {"released": gid}

    async def drain_group(self, caller: Caller, gid: str) -> dict[str, Any]:
        async with self.keeper.lock:
            g = self.group_record(gid)
            check_owner(caller, g.owner_uid, f"group {gid!r}")
            if g.state in ("lost", "reserved"):
                raise Conflict(f"group {gid!r} is {g.state} and cannot drain")
            if g.state in ("draining", "degraded"):  # degraded: its GPU is drained already; keep saying why
                return group_view(self.doc, g)
            with self.keeper.transaction() as doc:
                doc.groups[gid] = replace(doc.groups[gid], state=GroupState.DRAINING)
            return group_view(self.doc, self.doc.groups[gid])

    async def undrain_group(self, caller: Caller, gid: str) -> dict[str, Any]:
        """Let new work land on a drained group's devices again; a degraded one waits for its GPU's undrain."""
        async with self.keeper.lock:
            g = self.group_record(gid)
            check_owner(caller, g.owner_uid, f"group {gid!r}")
            if g.state == "degraded":
                raise Conflict(f"group {gid!r} is degraded: its GPU failed; undrain the GPU once it is healthy")
            if g.state != "draining":
                return group_view(self.doc, g)
            with self.keeper.transaction() as doc:
                doc.groups[gid] = replace(doc.groups[gid], state=GroupState.ALLOCATED)
            return group_view(self.doc, self.doc.groups[gid])

    async def drain_gpu(self, caller: Caller, index: int, drain: bool) -> dict[str, Any]:
        async with self.keeper.lock:
            try:
                gpu = self.keeper.machine.gpu(index)
            except KeyError:
                raise NotFound(f"no GPU {index}: `cgctl topo` lists the GPUs") from None
            groups = [g for g in self.doc.groups.values() if any(d.gpu_index == index for d in g.devices)]
            if not caller.is_root and caller.uid != os.geteuid():
                raise Forbidden(f"draining GPU {index} takes root (or cgd's own user): "
                                "it affects every user of the GPU")
            with self.keeper.transaction() as doc:
                drained = [u for u in doc.drained if u != gpu.uuid]
                if drain:
                    drained.append(gpu.uuid)
                doc.drained = tuple(drained)
                for g in groups:
                    current = doc.groups[g.id]
                    if drain and current.state == "allocated":
                        doc.groups[g.id] = replace(current, state=GroupState.DRAINING)
                    elif not drain and current.state in ("draining", "degraded") and index not in self.keeper.unhealthy:
                        doc.groups[g.id] = replace(current, state=GroupState.ALLOCATED)
                if not drain:
                    for name, comp in list(doc.components.items()):
                        mine = [g for g in doc.groups.values() if uses(g.users, name)]
                        if comp.state == "degraded" and not any(g.state == "degraded" for g in mine):
                            state = ComponentState.RUNNING if comp.spec.command else ComponentState.ALLOCATED
                            doc.components[name] = replace(comp, state=state)
            return {"gpu": index, "drained": drain, "groups": sorted(g.id for g in groups)}
