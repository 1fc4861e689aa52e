"""The operations of cgd: decide under the lock, write durably, then act.

Every public coroutine here is one API operation. Decisions live in
`computegroups.daemon.core.transactions`; processes are only touched through the supervisor,
and only after the state that asks for them is on disk (or, when stopping,
before the state forgets them).

The operations are split by concern into base.py (shared steps), events.py,
components.py, groups.py, upkeep.py and queries.py; `Manager` is all of them.
"""

from __future__ import annotations

from computegroups.daemon.core.components import Components
from computegroups.daemon.core.events import WorkerEvents
from computegroups.daemon.core.groups import Groups
from computegroups.daemon.core.keeper import StateKeeper
from computegroups.daemon.core.queries import Queries
from computegroups.daemon.core.transactions import Caller
from computegroups.daemon.core.upkeep import Upkeep
from computegroups.daemon.core.workers import WorkerPaths, watcher_key
from computegroups.daemon.supervision.supervisor import Supervisor

__all__ = ["Caller", "Manager"]


class Manager(WorkerEvents, Components, Groups, Upkeep, Queries):
    """The API's operations on one state keeper and one supervisor."""

    def __init__(self, keeper: StateKeeper, supervisor: Supervisor, paths: WorkerPaths) -> None:
        super().__init__(keeper, supervisor, paths)
        keeper.on_freed = self.queue_soon
        keeper.worker_pid = lambda component, replica, shim: supervisor.worker_pid(
            watcher_key(component, replica), shim)
