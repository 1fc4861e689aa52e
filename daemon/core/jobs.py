"""Jobs: replicas that end for good, time limits, the wait queue, and how long ended jobs are kept.

A part of `Manager` (see manager.py): every method runs on the manager's
state keeper and supervisor, and decides under its lock.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from msgspec.structs import replace

from computegroups.daemon.core.base import ManagerBase, log
from computegroups.daemon.core.jobstate import end_replica, finish_if_done, queued_request
from computegroups.daemon.core.queue import FINISHED, ahead_of, head_start, may_backfill, queue_order
from computegroups.daemon.core.transactions import component_or_404, new_component_records, remove_component
from computegroups.daemon.core.views import user_name
from computegroups.daemon.model.claims import Claim
from computegroups.daemon.model.enums import ComponentState, Outcome
from computegroups.daemon.model.errors import InsufficientCapacity, ManagerError
from computegroups.daemon.supervision.proctree import is_alive
from computegroups.statefiles.schema import ComponentRecord, StateDoc


class Jobs(ManagerBase):
    def head_start_time(self, doc: StateDoc, head: ComponentRecord) -> float:
        keeper = self.keeper
        keeper.sync_ledger(doc)
        return head_start(keeper.machine, keeper.config, keeper.allocator.holdings(), doc,
                          keeper.unavailable_gpus(doc), keeper.foreign, head, keeper.clock())

    def queue_blocker(self, doc: StateDoc, claim_priority: int, time_limit_s: float | None) -> str | None:
        """Why a new claim that fits must still wait behind the queue; None when it may go now."""
        ahead = ahead_of(doc, claim_priority)
        if not ahead:
            return None
        head_at = self.head_start_time(doc, ahead[0])
        if may_backfill(time_limit_s, self.keeper.clock(), head_at):
            return None
        many = len(ahead) > 1
        return (f"{len(ahead)} queued claim{'s' if many else ''} of this priority or higher "
                f"{'go' if many else 'goes'} first (the first is {ahead[0].name!r} of "
                f"{user_name(ahead[0].owner_uid)})"
                + ("" if time_limit_s is not None else "; a claim with a time limit that ends before "
                   f"{'they' if many else 'it'} can start may go around {'them' if many else 'it'}"))

    def check_queue(self, doc: StateDoc, claim: Claim | None, time_limit_s: float | None = None) -> None:
        """Inside a transaction, before capacity is taken for `claim`: refuse it while queued claims of
        its priority or higher wait, unless it is sure to end (`time_limit_s` from now) before the head
        can start. Every path that takes capacity asks this (a component, its scale-out, a reservation,
        a group, a deployment's new groups), so nothing starves the head of the queue; the refusal is
        the one a claim that does not fit gets, so a caller that may wait queues instead."""
        if claim is None:
            return
        blocker = self.queue_blocker(doc, claim.priority, time_limit_s)
        if blocker is not None:
            raise InsufficientCapacity(f"does not fit now: {blocker}")

    def queue_soon(self) -> None:
        """Place what the queue holds once the current operation lets the lock go.

        Capacity freed while a pass runs gets a pass of its own after it, so
        no freeing is missed and passes never run side by side."""
        if not any(c.state == ComponentState.PENDING for c in self.doc.components.values()):
            return
        if self._queue_task is not None and not self._queue_task.done():
            self._queue_again = True
            return
        self._queue_task = asyncio.get_running_loop().create_task(self._queue_passes())
        self._tasks.add(self._queue_task)
        self._queue_task.add_done_callback(self._task_done)

    async def _queue_passes(self) -> None:
        while True:
            self._queue_again = False
            await self.run_queue()
            if not self._queue_again:
                return

    async def run_queue(self) -> list[str]:
        """Place queued claims in order, going around a blocked head only by backfill; start their workers."""
        placed: list[str] = []
        async with self.keeper.lock:
            order = [c for c in queue_order(self.doc) if c.name not in self._busy]
            if not order:
                return placed
            now = self.keeper.clock()
            with self.keeper.transaction() as doc:
                head_at: float | None = None
                head = order[0]
                for queued in order:
                    if head_at is not None and not may_backfill(queued.spec.time_limit_s, now, head_at):
                        reason = behind_reason(head, queued, head_at, now)
                        if reason != queued.pending_reason:
                            doc.components[queued.name] = replace(queued, pending_reason=reason)
                        continue
                    request, caller = queued_request(queued)
                    del doc.components[queued.name]
                    try:
                        comp = new_component_records(doc, self.keeper, request, caller)
                    except InsufficientCapacity as exc:
                        doc.components[queued.name] = replace(queued, pending_reason=str(exc))
                        if head_at is None:
                            head, head_at = queued, self.head_start_time(doc, queued)
                        continue
                    except ManagerError as exc:
                        doc.components[queued.name] = replace(
                            queued, state=ComponentState.FAILED, pending_reason=str(exc), ended_at=now,
                            queued_at=None, waiter_pid=None, waiter_start=None)
                        log.warning("queued %s can no longer be placed: %s", queued.name, exc)
                        continue
                    doc.components[comp.name] = replace(
                        comp, lease_pid=queued.lease_pid, lease_start=queued.lease_start, created=now)
                    placed.append(comp.name)
            for name in placed:
                log.info("placed %s from the queue", name)
                refs = sorted(ref for ref, w in self.doc.workers.items() if w.component == name)
                try:
                    await self.start_workers(refs)
                except Exception as exc:
                    log.error("starting %s from the queue failed: %s", name, exc)
                    self._end_for_good(refs, Outcome.FAILED, None)
                else:
                    self.arm_time_limit(name)
        return placed

    def _end_for_good(self, refs: list[str], outcome: Outcome, exit_code: int | None) -> None:
        """Under the lock: these replicas ended for good; a component with none left is finished."""
        now = self.keeper.clock()
        with self.keeper.transaction() as doc:
            names = {doc.workers[r].component for r in refs if r in doc.workers}
            for ref in refs:
                end_replica(doc, ref, outcome, exit_code, now)
                self.replica_states.pop(ref, None)
            freed = [g for name in sorted(names) for g in finish_if_done(doc, name, now)]
        for name in sorted(names):
            comp = self.doc.components.get(name)
            if comp is not None and comp.state in FINISHED:
                log.info("%s %s; freed %s", name, comp.state, ", ".join(freed) or "no group of its own")
        if freed:
            self.queue_soon()

    def arm_time_limit(self, name: str) -> None:
        """Stop the component at its time limit (checked again then: it may have ended or been replaced)."""
        comp = self.doc.components.get(name)
        if comp is None or comp.spec.time_limit_s is None:
            return
        delay = max(0.0, comp.created + comp.spec.time_limit_s - self.keeper.clock())
        loop = asyncio.get_running_loop()
        loop.call_later(delay, lambda: self._spawn(self.enforce_time_limit(name, comp.created)))

    async def enforce_time_limit(self, name: str, created: float) -> None:
        async with self.keeper.lock:
            comp = self.doc.components.get(name)
            if (comp is None or comp.created != created or comp.state in FINISHED
                    or comp.state in (ComponentState.PENDING, ComponentState.RELEASING) or name in self._busy):
                return
            refs = [ref for ref, w in self.doc.workers.items() if w.component == name and w.outcome is None]
            self.mark_busy([name], "being stopped at its time limit")
        try:
            log.warning("%s reached its time limit of %gs: stopping it", name, comp.spec.time_limit_s)
            await self.stop_workers(refs)
            async with self.keeper.lock:
                self._end_for_good(refs, Outcome.TIMEOUT, None)
        finally:
            self.clear_busy([name])

    async def expire_jobs(self) -> None:
        """Forget ended jobs past the retention, and queued claims whose waiting client is gone."""
        now = self.keeper.clock()
        retention = self.config.jobs.retention_s
        async with self.keeper.lock:
            old = [c.name for c in self.doc.components.values()
                   if c.state in FINISHED and c.ended_at is not None and c.ended_at + retention <= now
                   and c.name not in self._busy]
            gone = [c.name for c in self.doc.components.values()
                    if c.state == ComponentState.PENDING and (
                        (c.waiter_pid and not is_alive(c.waiter_pid, c.waiter_start))
                        or (c.lease_pid and not is_alive(c.lease_pid, c.lease_start)))]
            if old or gone:
                with self.keeper.transaction() as doc:
                    for name in old + gone:
                        remove_component(doc, self.keeper, name, {name})
                if old:
                    log.info("forgot ended jobs past the retention (%gs): %s", retention, ", ".join(old))
                if gone:
                    log.info("dropped queued claims whose client is gone: %s", ", ".join(gone))
        if gone:
            self.queue_soon()

    async def wait_for(self, name: str, until: str, timeout: float) -> dict[str, Any]:
        """The component once it is placed (`until="placed"`) or has ended for good (`"ended"`), or at the timeout.

        The answer says which (`reached`); a component that is gone (a queued
        claim dropped, a release) is "no component".
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout if math.isfinite(timeout) else 1e9)
        while True:
            comp = component_or_404(self.doc, name)
            reached = comp.state in FINISHED if until == "ended" else comp.state != ComponentState.PENDING
            left = deadline - loop.time()
            if reached and until == "placed":
                # The pass that placed it starts its workers under the lock, after the commit that
                # woke this wait: answer once they run, with their pids, as a direct allocation does.
                async with self.keeper.lock:
                    return {"reached": True, "component": self.component(name)}
            if reached or left <= 0:
                return {"reached": reached, "component": self.component(name)}
            await self.keeper.changed(min(left, 5.0))


def behind_reason(head: ComponentRecord, queued: ComponentRecord, head_at: float, now: float) -> str:
    """Why a queued claim is not even tried while the head waits: it could delay the head's start."""
    who = f"{head.name!r} of {user_name(head.owner_uid)}, the first in the queue"
    limit = queued.spec.time_limit_s
    if limit is None:
        return f"waits behind {who}: a claim without a time limit never goes around it"
    when = "once it can start" if math.isinf(head_at) else f"in {max(0.0, head_at - now):.0f}s"
    return f"waits behind {who}, which starts {when}: its time limit ({limit:g}s) would end later"
