"""Upkeep: what health checks and expired leases and reservations change in the state.

A part of `Manager` (see manager.py): every method runs on the manager's
state keeper and supervisor, and decides under its lock.
"""

from __future__ import annotations

import os
from typing import Any

from msgspec.structs import replace

from computegroups.daemon.core.base import ManagerBase, log
from computegroups.daemon.core.transactions import Caller, release_reservation
from computegroups.daemon.core.views import user_name
from computegroups.daemon.core.workers import (
    groups_by_replica,
    visible_devices,
    watcher_key,
)
from computegroups.daemon.model.enums import ComponentState, GroupState
from computegroups.daemon.model.errors import Conflict, Forbidden
from computegroups.daemon.model.refs import ReplicaRef, component_of
from computegroups.daemon.supervision.proctree import is_alive


class Upkeep(ManagerBase):
    def acknowledge_state_loss(self, caller: Caller) -> dict[str, Any]:
        """Stop reporting the workers of a lost generation: an operator has seen them (root, or cgd's user).

        The processes are not touched: whether they go is their owners' call, or the operator's.
        """
        if not caller.is_root and caller.uid != os.geteuid():
            raise Forbidden("acknowledging a loss of cgd's state takes root (or cgd's own user)")
        acknowledged = self.state_loss
        for worker in self.lost_workers:
            worker.acknowledged = True
        if acknowledged:
            log.warning("state loss acknowledged by %s: %s", user_name(caller.uid),
                        ", ".join(w["replica"] for w in acknowledged))
        return {"acknowledged": acknowledged}

    def worker_pids_and_shares(self) -> tuple[dict[int, str], dict[tuple[str, int], int]]:
        roots: dict[int, str] = {}
        for ref, pids in self._pids().items():
            for pid in pids:
                roots[pid] = ref
        shares = {
            (ref, d.gpu_index): d.memory_mib
            for ref, groups in groups_by_replica(self.doc).items()
            for d in visible_devices(groups) if not d.whole
        }
        return roots, shares

    async def apply_health(self, facts) -> None:
        """Drain GPUs that failed, mark their groups degraded, account foreign memory."""
        foreign = {i: sum(p["used_memory_mib"] or 0 for p in f.foreign) for i, f in facts.items()}
        self.keeper.foreign = foreign
        self.keeper.allocator.set_foreign(foreign)
        failed = {i for i, f in facts.items() if f.health != "ok"}
        ended = self.ended_lost_workers() if self.lost_workers else []
        async with self.keeper.lock:
            if ended:
                self.hold_lost_gpus(ended)
            self._tell_health(self.keeper.unhealthy, failed, facts)
            self.keeper.hold_out(unhealthy=failed)
            uuids = {self.keeper.machine.gpu(i).uuid for i in failed}
            newly = uuids - set(self.doc.drained)
            hit = [g.id for g in self.doc.groups.values()
                   if g.state in ("allocated", "draining") and any(d.gpu_uuid in uuids for d in g.devices)]
            if newly or hit:
                for i in sorted(failed):
                    log.error("GPU %d failed: %s; draining it", i, "; ".join(facts[i].reasons))
                with self.keeper.transaction() as doc:
                    doc.drained = tuple(sorted(set(doc.drained) | uuids))
                    for gid in hit:
                        doc.groups[gid] = replace(doc.groups[gid], state=GroupState.DEGRADED)
                    for name in {component_of(u) for gid in hit for u in doc.groups[gid].users}:
                        if name in doc.components and doc.components[name].state != "releasing":
                            doc.components[name] = replace(doc.components[name], state=ComponentState.DEGRADED)
        for i, f in facts.items():
            for over in f.over_share:
                log.warning("worker %s uses %d MiB on GPU %d, over its share of %d MiB",
                            over["replica"], over["used_memory_mib"], i, over["share_mib"])
                if self.config.share_enforcement == "stop":
                    over_ref = ReplicaRef.parse(over["replica"])
                    key = watcher_key(over_ref.component, over_ref.replica)
                    if self.supervisor.is_running(key):
                        await self.keeper.durable()
                        self._stopping.add(key)
                        try:
                            await self.supervisor.stop_worker(key)
                        finally:
                            self._stopping.discard(key)
                        self.replica_states[over["replica"]] = "stopped-over-share"

    def _tell_health(self, was: set[int], now: set[int], facts) -> None:
        """A GPU that turned unhealthy, or healthy again, is an event for everyone on the machine."""
        for i in sorted(now - was):
            gpu = self.keeper.machine.gpu(i)
            self.keeper.events.emit("health_fault", f"GPU {i} {facts[i].health}: {'; '.join(facts[i].reasons)}",
                                    gpu=i, gpu_uuid=gpu.uuid, health=facts[i].health, reasons=list(facts[i].reasons))
        for i in sorted(was - now):
            self.keeper.events.emit("health_ok", f"GPU {i} is healthy again", gpu=i,
                                    gpu_uuid=self.keeper.machine.gpu(i).uuid)

    async def expire(self) -> None:
        """Release reservations past their time and leases whose client died.

        Each is handled on its own: one that cannot be released now (a lease
        someone still shares) must not hold back the others.
        """
        now = self.keeper.clock()
        async with self.keeper.lock:
            expired = [r.name for r in self.doc.reservations.values() if r.expires_at <= now]
            if expired:
                with self.keeper.transaction() as doc:
                    for name in expired:
                        release_reservation(doc, name)
                log.info("reservations expired: %s", ", ".join(expired))
            dead = [c for c in self.doc.components.values()
                    if c.lease_pid and c.state != "releasing" and c.name not in self._busy
                    and not is_alive(c.lease_pid, c.lease_start)]
        for record in dead:
            name = record.name
            try:
                async with self.keeper.lock:
                    if self.doc.components.get(name) != record or name in self._busy:
                        continue  # released, or another component of that name, since the list was made
                    closure, refs = self._begin_release([name])
                await self._finish_release(closure, refs)
                log.warning("released %s: the client that held its lease is gone", name)
            except Conflict as exc:
                log.warning("lease of %s ended but it cannot be released yet: %s", name, exc)
