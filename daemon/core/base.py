"""The state every part of the manager shares, and the steps they all take.

Starting and stopping workers, and the busy marks that keep two operations
off one component while its workers stop outside the lock.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from msgspec.structs import replace

from computegroups.daemon.core.keeper import StateKeeper
from computegroups.daemon.core.lost import LostWorker
from computegroups.daemon.core.transactions import (
    dependents,
    hand_back_primary,
    remove_component,
)
from computegroups.daemon.core.views import component_view
from computegroups.daemon.core.workers import (
    INSTANCE_VAR,
    Binding,
    WorkerPaths,
    binder,
    build_spec,
    watcher_key,
    write_role,
)
from computegroups.daemon.model.enums import ComponentState
from computegroups.daemon.model.errors import BadRequest, Conflict, NotFound, StillRunning
from computegroups.daemon.model.refs import uses
from computegroups.daemon.supervision.supervisor import Supervisor, WorkerStuck
from computegroups.statefiles.schema import StateDoc

log = logging.getLogger("cgd.manager")

PROMOTION_MIN_UPTIME_S = 1.0
"""A shadow younger than this is still starting (its signal handler may not be
installed, and the promotion signal would end it): the dead primary restarts
under its own restart policy instead, and no promotion loop can form. A worker
handed the primary role back that young is restarted as primary instead."""


class ManagerBase:
    def __init__(self, keeper: StateKeeper, supervisor: Supervisor, paths: WorkerPaths) -> None:
        self.keeper = keeper
        self.supervisor = supervisor
        self.paths = paths
        self.config = keeper.config
        self.replica_states: dict[str, str] = {}
        self._stopping: set[str] = set()
        self._busy: dict[str, str] = {}
        """Components whose workers are being stopped outside the lock, and why.

        Stopping can take a worker's whole grace period; the lock is not held
        for it, so other users are not stalled, and these names are refused
        to any other change until the operation that stops them commits."""
        self._tasks: set[asyncio.Task] = set()
        self._queue_task: asyncio.Task | None = None
        self._queue_again = False
        self._adhoc = 0
        self.lost_workers: list[LostWorker] = []
        """Workers a lost generation of the state had started, kept running (see lost.py): reported
        until an operator acknowledges the loss, their GPUs held until they end."""

    @property
    def state_loss(self) -> list[dict[str, Any]]:
        """The lost generation's workers not yet acknowledged, as status and health report them."""
        return [w.as_dict() for w in self.lost_workers if not w.acknowledged]

    def held_by_lost(self) -> dict[int, list[dict[str, Any]]]:
        """Per GPU, the lost generation's workers that hold it (acknowledged or not): GpuStatus."""
        out: dict[int, list[dict[str, Any]]] = {}
        for w in self.lost_workers:
            for i in w.gpus:
                out.setdefault(i, []).append({"replica": w.replica, "user": w.user,
                                              "pids": [pid for pid, _ in w.processes]})
        return out

    def ended_lost_workers(self) -> list[LostWorker]:
        """The lost generation's workers whose processes have all ended: reads /proc, so it is
        asked before the lock is taken, not under it."""
        return [w for w in self.lost_workers if not w.running()]

    def hold_lost_gpus(self, ended: list[LostWorker]) -> None:
        """Under the lock: forget the lost workers that have ended; the GPUs the others run on stay unavailable."""
        self.lost_workers = [w for w in self.lost_workers if not any(w is e for e in ended)]
        held: dict[int, tuple[str, ...]] = {}
        for w in self.lost_workers:
            for i in w.gpus:
                held[i] = (*held.get(i, ()), f"{w.replica} of {w.user}")
        if held != self.keeper.lost_holders:
            self.keeper.hold_out(lost_holders=held)

    @property
    def doc(self) -> StateDoc:
        return self.keeper.doc

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        """A failed background step (a worker event, a time limit) is logged now, not when the task is collected."""
        self._tasks.discard(task)
        exc = None if task.cancelled() else task.exception()
        if exc is not None:
            log.error("handling a worker event failed: %s", exc, exc_info=exc)

    async def start_workers(self, refs: list[str], resume: bool = False) -> None:
        """Start workers the state already asks for, once that is durable, then record their pids.

        `resume`: workers of an earlier cgd that ended while none ran (recovery): their failures
        in a row still count towards max_retries."""
        if not refs:
            return
        await self.keeper.durable()
        started = {}
        for ref in refs:
            w = self.doc.workers[ref]
            comp = self.doc.components[w.component]
            write_role(self.paths, comp.name, w.replica, w.role, comp.owner_uid, comp.owner_gid)
            spec = build_spec(self.doc, comp, w.replica, w.role, self.paths, self.config, self.keeper.machine)
            started[ref] = await self.supervisor.start_worker(spec, resume=resume)
            self.replica_states[ref] = "running"
        with self.keeper.transaction() as doc:
            for ref, ev in started.items():
                if ref in doc.workers:
                    doc.workers[ref] = replace(doc.workers[ref], pid=ev.pid, create_time=ev.create_time)
            for name in {doc.workers[ref].component for ref in started if ref in doc.workers}:
                failed = doc.components.get(name)
                if failed is not None and failed.state == ComponentState.FAILED and all(
                        w.pid for w in doc.workers.values() if w.component == name):
                    doc.components[name] = replace(failed, state=ComponentState.RUNNING)

    async def stop_workers(self, refs: list[str], timeout: float | None = None) -> None:
        """Stop workers all at once, once the change that stops them is durable: each may take its grace period."""
        await self.keeper.durable()
        keys = []
        for ref in refs:
            w = self.doc.workers.get(ref)
            if w is None:
                continue
            key = watcher_key(w.component, w.replica)
            self._stopping.add(key)
            keys.append((ref, key, w))

        async def stop(ref: str, key: str, w) -> None:
            if self.supervisor.is_running(key) or self.supervisor.supervises(key):
                await self.supervisor.stop_worker(key, timeout=timeout, hold_if_stuck=True)
            elif w.pid and w.create_time:
                await self.supervisor.stop_stray(w.pid, w.create_time, 10.0 if timeout is None else timeout, key)
            self.replica_states.pop(ref, None)

        try:
            results = await asyncio.gather(*(stop(ref, key, w) for ref, key, w in keys), return_exceptions=True)
            failures = [r for r in results if isinstance(r, BaseException)]
            stuck = [r for r in failures if isinstance(r, WorkerStuck)]
            if stuck:
                ref_of = {key: ref for ref, key, _ in keys}
                raise StillRunning(_stuck_message({ref_of.get(s.key, s.key): s.pids for s in stuck}))
            if failures:
                raise failures[0]
        finally:
            for _, key, _ in keys:
                self._stopping.discard(key)

    async def start_or_undo(self, refs: list[str], before: StateDoc, what: str) -> None:
        """Start the workers a change just committed, or put the state back as it was before it.

        Putting back the earlier document (not releasing what was added)
        matters when the change took over a reservation: a failed start must
        leave the reservation held, not consume it. The lock is held since
        `before` was read, so nothing else changed in between.
        """
        try:
            await self.start_workers(refs)
        except Exception as exc:
            log.error("starting %s failed: %s; undoing the change", what, exc)
            await self.stop_workers(refs)
            self.keeper.restore(before)
            for ref in refs:
                self.replica_states.pop(ref, None)
            raise BadRequest(f"could not start {what}: {exc}") from None

    def mark_busy(self, names: list[str], why: str) -> None:
        """Claim components for an operation that stops their workers outside the lock."""
        self.check_idle(*names)
        for name in names:
            self._busy[name] = why

    def busy_components(self) -> dict[str, str]:
        return dict(self._busy)

    def clear_busy(self, names: list[str]) -> None:
        for name in names:
            self._busy.pop(name, None)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait for the operations stopping workers outside the lock to commit; False if some are left."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._busy and loop.time() < deadline:
            await asyncio.sleep(0.05)
        return not self._busy

    def check_idle(self, *names: str | None) -> None:
        """Refuse a change to a component another operation is still stopping workers of."""
        for name in names:
            if name is not None and name in self._busy:
                raise Conflict(f"component {name!r} is {self._busy[name]}: try again once that is done")

    def check_groups_idle(self, name: str | None) -> None:
        """Refuse to attach to `name`'s groups while the component owning one of them is busy:
        a scale-in meanwhile would pull that group from under the new user."""
        if name is None:
            return
        owners = {g.owner for g in self.doc.groups.values() if uses(g.users, name)}
        self.check_idle(name, *sorted(owners))

    def _begin_release(self, names: list[str]) -> tuple[list[str], list[str]]:
        """Under the lock: mark the components and their shadows releasing, durably.

        From here on their exits restart nothing and nobody can attach to
        them; if cgd dies before `_finish_release`, recovery finishes it.
        """
        doc = self.doc
        closure: list[str] = []
        for name in names:
            for member in (name, *dependents(doc, name)[0]):
                if member not in closure:
                    closure.append(member)
        self.check_idle(*closure)
        for name in closure:
            sharers = [s for s in dependents(doc, name)[1] if s not in closure]
            if sharers:
                raise Conflict(f"component {sharers[0]!r} shares the groups of {name!r}: release it first")
        if closure:
            with self.keeper.transaction() as doc:
                for name in closure:
                    doc.components[name] = replace(doc.components[name], state=ComponentState.RELEASING)
        self.mark_busy(closure, "being released")
        return closure, [ref for ref, w in self.doc.workers.items() if w.component in closure]

    async def _finish_release(self, closure: list[str], refs: list[str],
                              stop_timeout: float | None = None) -> dict[str, Any]:
        """Hand the primary role back first (make before break: a replica with a live worker is never
        without a primary while the released one takes its grace period to stop); then, without the
        lock, stop the workers; then, under it, free the groups."""
        try:
            async with self.keeper.lock:
                with self.keeper.transaction() as doc:
                    handed, demoted = hand_back_primary(doc, set(closure))
                for ref in demoted:
                    w = self.doc.workers[ref]
                    comp = self.doc.components[w.component]
                    write_role(self.paths, comp.name, w.replica, w.role, comp.owner_uid, comp.owner_gid)
                await self._tell_primary(handed)
                leases = [(n, self.doc.components[n].owner_uid) for n in closure
                          if n in self.doc.components and self.doc.components[n].lease_pid]
            await self.stop_workers(refs, stop_timeout)
            for name, uid in leases:  # `cgctl run`: what its command left running goes with the lease
                left = await self.supervisor.end_marked(
                    {INSTANCE_VAR: self.paths.instance, "CG_COMPONENT": name}, uid, f"{name} (cgctl run)",
                    10.0 if stop_timeout is None else stop_timeout)
                if left:
                    raise StillRunning(_stuck_message({f"{name} (cgctl run)": tuple(sorted(left))}))
            freed: list[str] = []
            async with self.keeper.lock:
                present = [n for n in closure if n in self.doc.components]
                if present:
                    with self.keeper.transaction() as doc:
                        for name in sorted(present, key=lambda n: doc.components[n].shadow_of is None):
                            freed.extend(remove_component(doc, self.keeper, name, set(present)))
        finally:
            self.clear_busy(closure)
        return {"released": closure, "groups": sorted(freed)}

    async def _tell_primary(self, refs: list[str]) -> None:
        """Under the lock: workers the state made primary again (`hand_back_primary`) learn it.

        A worker that handles the promotion signal is told as a promoted shadow
        is; one too young for that, or not running, is (re)started as primary.
        A cgd killed before this is done finishes it at start (`_finish_promotion`)."""
        if not refs:
            return
        await self.keeper.durable()
        for ref in refs:
            w = self.doc.workers[ref]
            comp = self.doc.components[w.component]
            key = watcher_key(w.component, w.replica)
            write_role(self.paths, comp.name, w.replica, w.role, comp.owner_uid, comp.owner_gid)
            if (w.pid and w.create_time and self.supervisor.is_running(key)
                    and time.time() - w.create_time >= PROMOTION_MIN_UPTIME_S):
                self.supervisor.signal(key, self.config.promotion_signal)
                log.warning("%s is primary again: its promoted shadow was released", ref)
                continue
            self._stopping.add(key)
            try:
                await self.supervisor.stop_worker(key, timeout=0)
            finally:
                self._stopping.discard(key)
            log.warning("%s restarts as primary: its promoted shadow was released", ref)
            await self.start_workers([ref])

    def group_record(self, gid: str):
        g = self.doc.groups.get(gid)
        if g is None:
            raise NotFound(f"no group {gid!r}: `cgctl group list` shows the groups in use")
        return g

    @property
    def binding(self) -> Binding:
        """Each replica's CPU binding, as the views show it and the workers get it."""
        return binder(self.keeper.machine, self.config)

    def component(self, name: str) -> dict[str, Any]:
        """A component being released is shown as such: a release that stopped short (a worker
        stuck in the kernel) leaves it `releasing`, holding its devices, until it is released again."""
        comp = self.doc.components.get(name)
        if comp is None:
            raise NotFound(f"no component named {name!r}: `cgctl list` shows what exists")
        return component_view(self.doc, comp, self._pids(), self.config.device_naming, self.replica_states,
                              self.binding, self._memory())

    def _memory(self) -> dict[str, int]:
        """Per replica, the memory its worker and all it started use, where its cgroup counts it."""
        out: dict[str, int] = {}
        for ref, w in self.doc.workers.items():
            used = self.supervisor.memory(watcher_key(w.component, w.replica))
            if used is not None:
                out[ref] = used
        return out

    def _pids(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for ref, w in self.doc.workers.items():
            key = watcher_key(w.component, w.replica)
            if self.supervisor.supervises(key):  # the worker's own pid, not its launch shim's
                live = self.supervisor.pids(key)
                if live:
                    out[ref] = live
            elif w.pid:
                out[ref] = [w.pid]
        return out


def _stuck_message(stuck: dict[str, tuple[int, ...]]) -> str:
    who = "; ".join(f"{what}: pids {', '.join(map(str, pids))}" for what, pids in sorted(stuck.items()))
    return (f"still running after SIGKILL (stuck in the kernel?): {who}; their devices stay held "
            "until they are gone: try again then")
