"""Reads: the views of components, groups and reservations, worker environments and logs.

A part of `Manager` (see manager.py): every method runs on the manager's
state keeper and supervisor, and decides under its lock.
"""

from __future__ import annotations

from typing import Any

from computegroups.daemon.core.base import ManagerBase
from computegroups.daemon.core.queue import FINISHED
from computegroups.daemon.core.transactions import (
    Caller,
    check_owner,
    component_or_404,
)
from computegroups.daemon.core.views import (
    component_view,
    group_deployment,
    group_view,
    reservation_view,
    user_name,
)
from computegroups.daemon.core.workers import (
    build_env,
    replica_ref,
    watcher_key,
)
from computegroups.daemon.model.enums import ComponentState, Role
from computegroups.daemon.model.errors import BadRequest, Conflict, Forbidden, NotFound
from computegroups.daemon.model.refs import uses
from computegroups.daemon.model.requests import reserved_env
from computegroups.daemon.supervision.worklogs import read_worker_log
from computegroups.topology.model import Machine
from computegroups.topology.names import model_matches


class Queries(ManagerBase):
    def components(self, owner: int | None = None) -> list[dict[str, Any]]:
        pids, memory = self._pids(), self._memory()
        return [
            component_view(self.doc, c, pids, self.config.device_naming, self.replica_states, self.binding, memory)
            for c in sorted(self.doc.components.values(), key=lambda c: c.name)
            if owner is None or c.owner_uid == owner
        ]

    def worker_pids(self) -> dict[str, list[int]]:
        """The live pids of each replica's worker (its own, not its launch shim's)."""
        return self._pids()

    def reservations(self) -> list[dict[str, Any]]:
        return [reservation_view(self.doc, r) for r in sorted(self.doc.reservations.values(), key=lambda r: r.name)]

    def groups(self, component: str | None = None, state: str | None = None, gpu: int | None = None, *,
               model: str | None = None, pool: str | None = None, uuid: str | None = None,
               owner: str | None = None, deployment: str | None = None) -> list[dict[str, Any]]:
        """The groups that match every filter given: who uses them, where they are, whose they are.

        `model` is a glob over the GPU model of any of the group's devices; `pool`
        keeps groups whose devices all lie in that pool; `uuid` is a `GPU-` or
        `MIG-` UUID of one of its devices; `owner` the owner as the group names it
        (a component, a reservation, a deployment path, `@UID` or `@LOGIN`).
        """
        machine = self.keeper.machine
        pools = self.config.allocator.pools
        if owner is not None and owner.startswith("@") and not owner[1:].isdigit():
            owner = f"@{_uid_of(owner[1:])}"  # `@alice`, as `cgctl group list` shows a group made on its own
        if pool is not None and pool not in pools:
            raise BadRequest(f"pool: unknown pool {pool!r} (pools: {', '.join(sorted(pools)) or 'none configured'})")
        out = []
        for g in sorted(self.doc.groups.values(), key=lambda g: g.id):
            if component and component != g.owner and not uses(g.users, component):
                continue
            if state and g.state != state:
                continue
            if gpu is not None and not any(d.gpu_index == gpu for d in g.devices):
                continue
            if model is not None and not any(
                    model_matches(_gpu_name(machine, d.gpu_index), model) for d in g.devices):
                continue
            if pool is not None and not (g.devices and all(d.gpu_index in pools[pool] for d in g.devices)):
                continue
            if uuid is not None and not any(uuid in (d.gpu_uuid, d.mig_uuid) for d in g.devices):
                continue
            if owner is not None and g.owner != owner:
                continue
            if deployment is not None and group_deployment(self.doc, g) != deployment:
                continue
            out.append(group_view(self.doc, g))
        return out

    def env(self, caller: Caller, name: str, replica: int) -> dict[str, str]:
        """What selects a replica's devices and describes its group: the variables cgd sets
        (`requests.reserved_env`), not a CUDA_HOME the owner passed.

        Meant for `eval "$(cgctl env NAME)"` in the asker's own shell: the
        worker's PATH, HOME, USER and LANG are its own and must not replace
        the shell's.
        """
        comp = component_or_404(self.doc, name)
        check_owner(caller, comp.owner_uid, f"component {name!r}")
        # An empty CUDA_VISIBLE_DEVICES would send `eval "$(cgctl env NAME)"` on to run on no GPU.
        if comp.state == ComponentState.PENDING:
            raise Conflict(f"{name!r} is queued and holds no devices yet: its variables exist once it is "
                           "placed (`cgctl list` shows its turn)")
        if comp.state in FINISHED:
            raise Conflict(f"{name!r} has ended ({comp.state}) and holds no devices any more")
        if not 0 <= replica < comp.replicas:
            raise NotFound(f"{name!r} has replicas 0..{comp.replicas - 1}, not {replica}")
        worker = self.doc.workers.get(replica_ref(name, replica))
        role = worker.role if worker else (Role.SHADOW if comp.shadow_of else Role.PRIMARY)
        env = build_env(self.doc, comp, replica, role, self.paths, self.config, self.keeper.machine)
        return {k: v for k, v in env.items() if reserved_env(k)}

    def owned_component(self, caller: Caller, name: str, replica: int):
        comp = component_or_404(self.doc, name)
        if not caller.is_root and caller.uid != comp.owner_uid:
            raise Forbidden(f"component {name!r} belongs to {user_name(comp.owner_uid)}; its logs are its owner's")
        if not 0 <= replica < max(comp.replicas, 1):
            raise NotFound(f"{name!r} has no replica {replica}")
        return comp

    def logs(self, caller: Caller, name: str, replica: int, stream: str, tail: int | None,
             offset: int | None) -> dict[str, Any]:
        """A replica's log, for its owner or root."""
        comp = self.owned_component(caller, name, replica)
        return read_worker_log(self.paths.log_dir, comp.name, replica, stream, comp.owner_uid, tail, offset)

    def worker_counts(self) -> tuple[int, int]:
        """(workers that should be running, those of them whose process runs now).

        A replica that ended for good (a job completed or out of retries) is
        kept in the state for a while but is not expected to run, nor is one
        of a component being released: counting them would make every ended
        job look like a worker cgd failed to keep alive.
        """
        doc = self.doc
        expected = [watcher_key(w.component, w.replica) for w in doc.workers.values()
                    if w.outcome is None and doc.components[w.component].state not in NOT_RUNNING]
        return len(expected), sum(1 for key in expected if self.supervisor.is_running(key))


NOT_RUNNING = FINISHED | {ComponentState.RELEASING, ComponentState.PENDING}
"""Components whose workers are not expected to run (a pending one has none yet)."""


def _gpu_name(machine: Machine, index: int) -> str:
    try:
        return machine.gpu(index).name
    except KeyError:  # a lost group's GPU is gone: it has no model any more
        return ""


def _uid_of(login: str) -> int:
    import pwd

    try:
        return pwd.getpwnam(login).pw_uid
    except KeyError:
        raise BadRequest(f"owner: no user named {login!r}") from None

