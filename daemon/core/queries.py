"""Reads: the views of components, groups and reservations, worker environments and logs.

A part of `Manager` (see manager.py): every method runs on the manager's
state keeper and supervisor, and decides under its lock.
"""

from __future__ import annotations

from typing import Any

from computegroups.daemon.core.base import ManagerBase
from computegroups.daemon.core.transactions import (
    Caller,
    check_owner,
    component_or_404,
)
from computegroups.daemon.core.views import component_view, group_view, reservation_view, user_name
from computegroups.daemon.core.workers import (
    build_env,
    replica_ref,
    watcher_key,
)
from computegroups.daemon.model.enums import Role
from computegroups.daemon.model.errors import Forbidden, NotFound
from computegroups.daemon.model.refs import uses
from computegroups.daemon.model.requests import reserved_env
from computegroups.daemon.supervision.worklogs import read_worker_log


class Queries(ManagerBase):
    def components(self, owner: int | None = None) -> list[dict[str, Any]]:
        pids, memory = self._pids(), self._memory()
        return [
            component_view(self.doc, c, pids, self.config.device_naming, self.replica_states, memory)
            for c in sorted(self.doc.components.values(), key=lambda c: c.name)
            if owner is None or c.owner_uid == owner
        ]

    def worker_pids(self) -> dict[str, list[int]]:
        """The live pids of each replica's worker (its own, not its launch shim's)."""
        return self._pids()

    def reservations(self) -> list[dict[str, Any]]:
        return [reservation_view(self.doc, r) for r in sorted(self.doc.reservations.values(), key=lambda r: r.name)]

    def groups(self, component: str | None, state: str | None, gpu: int | None) -> list[dict[str, Any]]:
        out = []
        for g in sorted(self.doc.groups.values(), key=lambda g: g.id):
            if component and component != g.owner and not uses(g.users, component):
                continue
            if state and g.state != state:
                continue
            if gpu is not None and not any(d.gpu_index == gpu for d in g.devices):
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
        if not 0 <= replica < comp.replicas:
            raise NotFound(f"{name!r} has replicas 0..{comp.replicas - 1}, not {replica}")
        worker = self.doc.workers.get(replica_ref(name, replica))
        role = worker.role if worker else (Role.SHADOW if comp.shadow_of else Role.PRIMARY)
        env = build_env(self.doc, comp, replica, role, self.paths, self.config)
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
        """(workers the state asks for, workers whose process runs now)."""
        doc = self.doc
        keys = (watcher_key(w.component, w.replica) for w in doc.workers.values())
        running = sum(1 for key in keys if self.supervisor.is_running(key))
        return len(doc.workers), running
