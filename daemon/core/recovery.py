"""Start-up after a crash or an upgrade: make the processes match the state.

cgd may have died with `kill -9`, leaving workers running. On start it keeps
every worker the state knows (same pid AND same start time, so a reused pid
is never mistaken for one), starts the ones that died meanwhile, finishes
releases that were cut short, and stops processes of a previous run that the
state says should not run. Workers of replicas the state has no record of at
all (it fell back to an older generation) are kept and reported instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Collection
from dataclasses import dataclass

from msgspec.structs import replace

from computegroups.daemon.core.events import swap_roles
from computegroups.daemon.core.lost import LostWorker, gpus_named
from computegroups.daemon.core.manager import Manager
from computegroups.daemon.core.queue import FINISHED
from computegroups.daemon.core.transactions import remove_component
from computegroups.daemon.core.workers import INSTANCE_VAR, build_spec, replica_ref, watcher_key, write_role
from computegroups.daemon.model.enums import ComponentState, Outcome, RestartMode
from computegroups.daemon.model.errors import StateUnwritable
from computegroups.daemon.model.refs import component_of
from computegroups.daemon.supervision.proctree import marked_processes, process_trees
from computegroups.statefiles.errors import StateError
from computegroups.statefiles.schema import MachineFingerprint, WorkerRecord
from computegroups.statefiles.store import mark_lost
from computegroups.topology.model import Machine

log = logging.getLogger("cgd.recovery")


@dataclass(frozen=True)
class RecoveryReport:
    adopted: tuple[str, ...]
    started: tuple[str, ...]
    strays_stopped: tuple[int, ...]
    lost_groups: tuple[str, ...]


def instance_processes(instance: str) -> list[tuple[int, float, str, dict[str, str]]]:
    """(pid, start time, replica ref, environment) of every process carrying this cgd's mark."""
    found = []
    for pid, start, env in marked_processes({INSTANCE_VAR: instance}):
        replica = env.get("CG_REPLICA", "")
        ref = replica_ref(env.get("CG_COMPONENT", "?"), int(replica) if replica.isdigit() else -1)
        found.append((pid, start, ref, env))
    return found


def lost_generation_workers(marked: list[tuple[int, float, str, dict[str, str]]],
                            components: Collection[str], machine: Machine) -> list[LostWorker]:
    """The replicas of marked processes whose component the state has no record of, as the loss to report.

    cgd records a component before it starts its workers and stops them
    before the record goes, so a running process of this state's mark whose
    component has no record was started by a generation the state no longer
    holds: the state fell back to an older snapshot. Such a worker is kept,
    not stopped as a stray: the state lost track of it, its owner did not ask
    for it to end. Its owner and devices come from its own environment, as
    cgd set it. (A worker of a recorded component without a worker record
    was started a moment before a crash, before its pid was committed: a
    stray, stopped and started again by its policy.)
    """
    by_ref: dict[str, LostWorker] = {}
    for pid, start, ref, env in marked:
        if component_of(ref) in components:
            continue
        devices = env.get("CUDA_VISIBLE_DEVICES", "")
        worker = by_ref.setdefault(ref, LostWorker(replica=ref, user=env.get("USER", "unknown"), devices=devices,
                                                   gpus=gpus_named(devices, machine), processes=[]))
        worker.processes.append((pid, start))
    return [by_ref[ref] for ref in sorted(by_ref)]


async def recover(manager: Manager) -> RecoveryReport:
    keeper = manager.keeper
    machine = keeper.machine
    async with keeper.lock:
        with keeper.transaction() as doc:
            before = {gid for gid, g in doc.groups.items() if g.state == "lost"}
            mark_lost(doc, {g.uuid for g in machine.gpus})
            doc.machine = MachineFingerprint(hostname=machine.hostname, gpu_uuids=machine.fingerprint)
            lost = sorted(gid for gid, g in doc.groups.items() if g.state == "lost" and gid not in before)
            for gid in lost:
                log.error("group %s is lost: one of its GPUs is no longer in this machine", gid)
            lost_users = {component_of(u) for gid, g in doc.groups.items() if g.state == "lost" for u in g.users}
            for name in lost_users:
                if name in doc.components:
                    doc.components[name] = replace(doc.components[name], state=ComponentState.LOST)

        await keeper.durable()
        releasing = [c.name for c in keeper.doc.components.values() if c.state == "releasing"]
        await asyncio.gather(*(
            manager.supervisor.stop_stray(w.pid, w.create_time, 10.0, watcher_key(w.component, w.replica))
            for w in keeper.doc.workers.values() if w.component in releasing and w.pid and w.create_time
        ))
        if releasing:
            with keeper.transaction() as doc:
                for name in releasing:
                    remove_component(doc, keeper, name, set(releasing))
            log.warning("finished releasing %s, cut short by the previous run", ", ".join(releasing))
            await keeper.durable()

        adopted, to_start, ended, refused = [], [], [], []
        told: dict[str, int] = {}
        for ref, w in sorted(keeper.doc.workers.items()):
            comp = keeper.doc.components.get(w.component)
            if comp is None or comp.state == "lost" or comp.state in FINISHED or w.outcome is not None:
                continue
            try:
                spec = build_spec(keeper.doc, comp, w.replica, w.role, manager.paths, keeper.config,
                                  keeper.machine)
            except ValueError as exc:  # a state written before a rule existed (LD_PRELOAD for root)
                log.error("not running %s again: %s", ref, exc)
                refused.append(ref)  # its process, if alive, is a stray now: stopped below
                continue
            mode = comp.spec.restart.mode
            if w.pid and w.create_time and manager.supervisor.adopt(spec, w.pid, w.create_time):
                adopted.append(ref)
                manager.replica_states[ref] = "adopted"
                continue
            # read once it is known not to run: a shim that ended meanwhile has written its status by then
            code = manager.supervisor.exit_status(watcher_key(w.component, w.replica), w.pid) if w.pid else None
            if code is not None and mode != RestartMode.ALWAYS and (code == 0 or mode == RestartMode.NEVER):
                told[ref] = code  # it ended while no cgd ran, and its launch shim wrote how
            elif mode == RestartMode.NEVER and w.pid:
                ended.append(ref)  # it ran, and ended while cgd was down (a reboot, say): never again
            else:
                to_start.append(ref)
        if ended:
            log.warning("not starting %s again (restart policy never): not running when cgd started",
                        ", ".join(ended))
            manager._end_for_good(ended, Outcome.FAILED, None)
        if refused:
            manager._end_for_good(refused, Outcome.FAILED, None)
        for ref, code in told.items():
            log.info("%s ended with status %d while cgd was down", ref, code)
            manager._end_for_good([ref], Outcome.COMPLETED if code == 0 else Outcome.FAILED, code)
        counted = [ref for ref in to_start if keeper.doc.workers[ref].pid
                   and keeper.doc.components[keeper.doc.workers[ref].component].spec.restart.mode
                   == RestartMode.ON_FAILURE]
        if counted:  # an end nobody saw (a reboot) counts as a failure for on-failure
            with keeper.transaction() as doc:
                for ref in counted:
                    doc.workers[ref] = replace(doc.workers[ref], restarts=doc.workers[ref].restarts + 1)

        _fail_over(manager, to_start)
        await keeper.durable()
        for ref in adopted:
            _finish_promotion(manager, keeper.doc.workers[ref])

        kept = process_trees(keeper.doc.workers[ref].pid for ref in adopted)
        marked = [(pid, start, ref, env) for pid, start, ref, env in instance_processes(manager.paths.instance)
                  if pid not in kept and pid != os.getpid()]
        recorded = keeper.doc.components.keys() | set(releasing)  # a release finished just now left these
        manager.lost_workers = lost_generation_workers(marked, recorded, machine)
        for lost_worker in manager.lost_workers:
            keeper.events.emit(
                "state_fallback", f"{lost_worker.replica} (user {lost_worker.user}) kept running: "
                "started by a generation of the state that was lost", replica=lost_worker.replica,
                pids=[pid for pid, _ in lost_worker.processes], owner=lost_worker.user)
            log.error("kept %s (pids %s, user %s, GPUs %s) running: started by a generation of the state that "
                      "was lost (a fallback to an older state?); its GPUs are held until it ends; acknowledge "
                      "with `cgctl ack-state-loss` once looked at", lost_worker.replica,
                      ", ".join(str(pid) for pid, _ in lost_worker.processes), lost_worker.user,
                      ",".join(map(str, lost_worker.gpus)) or "none")
        manager.hold_lost_gpus(manager.ended_lost_workers())
        # A `cgctl run` command is cgctl's child, not a worker: it has no worker record, and its lease
        # (alive, or released by the upkeep with what it left) decides when it ends.
        leases = {n for n, c in keeper.doc.components.items() if c.lease_pid and n not in releasing}
        strays = [(pid, start, ref) for pid, start, ref, _ in marked
                  if component_of(ref) in recorded and component_of(ref) not in leases]
        for pid, _, ref in strays:
            log.warning("stopping pid %d (%s): the state says it should not run", pid, ref)
        await asyncio.gather(*(manager.supervisor.stop_stray(pid, start, 10.0) for pid, start, _ in strays))

        await manager.start_workers(to_start, resume=True)
    for name, comp in keeper.doc.components.items():
        if comp.state not in FINISHED and comp.spec.time_limit_s is not None and comp.state != "pending":
            manager.arm_time_limit(name)
    manager.queue_soon()
    for ref in adopted:
        log.info("adopted %s (pid %s) from the previous run", ref, keeper.doc.workers[ref].pid)
    return RecoveryReport(tuple(adopted), tuple(to_start), tuple(pid for pid, _, _ in strays), tuple(lost))


def _fail_over(manager: Manager, to_start: list[str]) -> None:
    """Primaries that died while cgd was down hand over to their live shadows,
    as they would have with cgd up; `_finish_promotion` then tells the shadows."""
    keeper = manager.keeper
    swaps = []
    for ref in to_start:
        w = keeper.doc.workers[ref]
        partner = manager.standby_partner(keeper.doc, w.component, w.replica) if w.role == "primary" else None
        if partner is not None:
            swaps.append((ref, partner))
    if swaps:
        with keeper.transaction() as doc:
            for dead, partner in swaps:
                swap_roles(doc, dead, partner, keeper.clock())
        for dead, partner in swaps:
            log.warning("%s died while cgd was down: its shadow %s is primary now", dead, partner)


def _finish_promotion(manager: Manager, worker: WorkerRecord) -> None:
    """Make an adopted worker's role file say what the state says.

    A promotion is committed before the role file is written and the signal
    sent; a cgd killed in between leaves a primary whose file still says
    shadow and which was never told. A missing file (the runtime directory
    moved with `--socket`) is only written: a worker that never was a shadow
    may have no handler for the promotion signal, whose default ends it.
    """
    path = manager.paths.role_file(worker.component, worker.replica)
    try:
        on_disk = path.read_text().strip()
    except OSError:
        on_disk = None
    if on_disk == worker.role:
        return
    comp = manager.keeper.doc.components[worker.component]
    write_role(manager.paths, worker.component, worker.replica, worker.role, comp.owner_uid, comp.owner_gid)
    if worker.role == "primary" and on_disk == "shadow":
        manager.supervisor.signal(watcher_key(worker.component, worker.replica), manager.config.promotion_signal)
        log.warning("finished promoting %s, cut short by the previous run", worker.key)


SHUTDOWN_WAIT_S = 30.0
"""How long a stopping cgd lets releases, scale-ins and restarts in progress commit
(well inside the units' TimeoutStopSec=90); one cut short is finished or undone at the next start."""


async def shutdown(manager: Manager, keep_workers: bool) -> None:
    """Stop every worker gracefully, or leave them all for the next cgd."""
    if not await manager.wait_idle(SHUTDOWN_WAIT_S):
        log.warning("stopping before operations in progress finished: %s", ", ".join(
            f"{name} {why}" for name, why in sorted(manager.busy_components().items())))
    async with manager.keeper.lock:
        keys = [watcher_key(w.component, w.replica) for w in manager.keeper.doc.workers.values()]
        manager._stopping.update(keys)
        await manager.supervisor.stop(keep_workers=keep_workers)
        try:
            if not keep_workers:
                with manager.keeper.transaction() as doc:
                    for ref, w in doc.workers.items():
                        doc.workers[ref] = replace(w, pid=None, create_time=None)
            await manager.keeper.durable()
        except (StateError, StateUnwritable) as exc:
            # The workers are stopped (or kept) all the same; the next cgd finds what runs and what does not.
            log.error("stopping with a state that cannot be written: %s", exc)
