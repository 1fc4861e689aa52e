"""Worker events: a start recorded, an exit handled, and the failover of a primary to its shadow.

A part of `Manager` (see manager.py): every method runs on the manager's
state keeper and supervisor, and decides under its lock.
"""

from __future__ import annotations

import time

from msgspec.structs import replace

from computegroups.daemon.core.base import PROMOTION_MIN_UPTIME_S, log
from computegroups.daemon.core.jobs import Jobs
from computegroups.daemon.core.transactions import dependents
from computegroups.daemon.core.workers import (
    parse_watcher_key,
    replica_ref,
    watcher_key,
    write_role,
)
from computegroups.daemon.model.enums import Outcome, RestartMode, Role
from computegroups.daemon.supervision.supervisor import WorkerExit, WorkerStart
from computegroups.statefiles.schema import StateDoc

THEN = {"promote": "its shadow takes over", "restart": "restarting", "complete": "done", "fail": "failed"}
"""What follows a worker's exit, in `worker_exited`'s `then` and its message."""


class WorkerEvents(Jobs):
    def on_worker_exit(self, event: WorkerExit) -> None:
        self._spawn(self._handle_exit(event, time.monotonic()))

    def on_worker_start(self, event: WorkerStart) -> None:
        self._spawn(self._record_start(event))

    async def _record_start(self, event: WorkerStart) -> None:
        component, replica = parse_watcher_key(event.key)
        ref = replica_ref(component, replica)
        async with self.keeper.lock:
            worker = self.doc.workers.get(ref)
            if worker is None or worker.outcome is not None or (
                    worker.pid == event.pid and worker.create_time == event.create_time):
                return  # a replica that ended for good runs nothing, whatever a late report says
            with self.keeper.transaction() as doc:
                if ref in doc.workers:
                    doc.workers[ref] = replace(doc.workers[ref], pid=event.pid, create_time=event.create_time)
            self.replica_states[ref] = "running"

    async def _handle_exit(self, event: WorkerExit, reported: float) -> None:
        """`reported`: when supervision told of the exit (monotonic), from which a promotion is timed."""
        component, replica = parse_watcher_key(event.key)
        ref = replica_ref(component, replica)
        if event.key in self._stopping:
            return
        partner = self._failover(ref)
        if partner is not None:
            self.keeper.instruments.promotion_seconds.observe(time.monotonic() - reported)
        async with self.keeper.lock:
            doc = self.doc
            comp = doc.components.get(component)
            worker = doc.workers.get(ref)
            if comp is None or comp.state == "releasing" or worker is None or event.key in self._stopping:
                return
            then = ("promote" if partner is not None else "restart" if event.will_restart
                    else "complete" if event.returncode == 0 and comp.spec.restart.mode != RestartMode.ALWAYS
                    else "fail")
            self.worker_exited(comp.owner_uid, ref, event, then)
            if partner is not None:
                await self._promote(ref, partner)
                return
            if event.will_restart:
                log.warning("worker %s (pid %s) ended with %s; restarting", ref, event.pid, event.status)
                self.replica_states[ref] = "restarting"
                with self.keeper.transaction() as doc:
                    w = doc.workers[ref]
                    doc.workers[ref] = replace(w, pid=None, create_time=None, restarts=w.restarts + 1,
                                               exit_code=event.returncode)
                return
            completed = event.returncode == 0 and comp.spec.restart.mode != RestartMode.ALWAYS
            outcome = Outcome.COMPLETED if completed else Outcome.FAILED
            (log.info if completed else log.warning)(
                "worker %s (pid %s) ended with %s: %s", ref, event.pid, event.status, outcome)
            self._end_for_good([ref], outcome, event.returncode)

    def worker_exited(self, uid: int, ref: str, event: WorkerExit, then: str) -> None:
        """Tell of a worker's end that cgd did not ask for, and what follows it."""
        code = event.returncode
        signal_name = event.status.removeprefix("signal ") if code is not None and code < 0 else None
        component, replica = parse_watcher_key(event.key)
        pid = event.worker or event.pid
        self.keeper.events.emit(
            "worker_exited", f"{ref} (pid {pid}) ended: {event.status}; {THEN[then]}", uid=uid,
            component=component, replica=replica, pid=pid, shim_pid=event.pid,
            exit_code=code if code is not None and code >= 0 else None, signal=signal_name, then=then)

    def _failover(self, dead_ref: str) -> str | None:
        """Tell the dead primary's shadow it serves now, before waiting for the lock.

        The lock may be held for seconds (an allocation spawning a hundred
        workers); the shadow must hear within milliseconds of the death. The
        state records the promotion once the lock is free (`_promote`).
        Returns the promoted shadow's ref, or None when there is none.
        """
        doc = self.doc
        dead = doc.workers.get(dead_ref)
        comp = doc.components.get(dead.component) if dead is not None else None
        if dead is None or comp is None or comp.state == "releasing" or dead.role != "primary":
            return None
        partner_ref = self.standby_partner(doc, dead.component, dead.replica)
        if partner_ref is None:
            return None
        partner = doc.workers[partner_ref]
        owner = doc.components[partner.component]
        write_role(self.paths, partner.component, partner.replica, "primary", owner.owner_uid, owner.owner_gid)
        self.supervisor.signal(watcher_key(partner.component, partner.replica), self.config.promotion_signal)
        log.warning("promoted %s to primary after %s died", partner_ref, dead_ref)
        return partner_ref

    def standby_partner(self, doc: StateDoc, component: str, replica: int) -> str | None:
        """The live shadow that takes over when this primary dies, if any."""
        comp = doc.components[component]
        partners = [comp.shadow_of] if comp.shadow_of else dependents(doc, component)[0]
        for name in partners:
            ref = replica_ref(name, replica)
            w = doc.workers.get(ref)
            key = watcher_key(name, replica)
            if name in self._busy or key in self._stopping or doc.components[name].state == "releasing":
                continue  # a shadow on its way out would leave the primary's replica with no primary
            if (w and w.role == "shadow" and w.pid and w.create_time
                    and self.supervisor.is_running(key)
                    and time.time() - w.create_time >= PROMOTION_MIN_UPTIME_S):
                return ref
        return None

    async def _promote(self, dead_ref: str, partner_ref: str) -> None:
        """Record a promotion `_failover` made: the shadow serves now, the dead
        primary comes back as its shadow. Called with the lock held."""
        if partner_ref not in self.doc.workers:
            return
        with self.keeper.transaction() as doc:
            swap_roles(doc, dead_ref, partner_ref, self.keeper.clock())
        await self.keeper.durable()
        dead = self.doc.workers[dead_ref]
        key = watcher_key(dead.component, dead.replica)
        self._stopping.add(key)
        try:
            await self.supervisor.stop_worker(key, timeout=0)
        finally:
            self._stopping.discard(key)
        await self.start_workers([dead_ref])


def swap_roles(doc: StateDoc, dead_ref: str, partner_ref: str, now: float) -> None:
    """Inside a transaction: the shadow is primary now, the dead primary will come back as its shadow."""
    p = doc.workers[partner_ref]
    doc.workers[partner_ref] = replace(p, role=Role.PRIMARY, promotions=p.promotions + 1, last_promoted_at=now)
    doc.workers[dead_ref] = replace(doc.workers[dead_ref], role=Role.SHADOW, pid=None, create_time=None)
