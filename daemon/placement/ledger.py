"""What is in use, kept per GPU so a decision never walks every live group.

The ledger is the allocator's only mutable state. Every change goes through
`add` and `remove`, which are exact inverses, so a placement that fails half
way is undone by replaying its log backwards, and `Allocator.follow` brings it
in line with the state document by removing and adding only what differs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from computegroups.daemon.placement.records import Holding
from computegroups.topology.model import Machine


class Ledger:
    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.total = {g.index: g.memory_mib or 0 for g in machine.gpus}
        self.holdings: dict[str, Holding] = {}
        self.memory_used = {g: 0 for g in self.total}
        self.compute_used = {g: 0 for g in self.total}
        self.groups_on: dict[int, set[str]] = {g: set() for g in self.total}
        self.whole_on: dict[int, int] = {g: 0 for g in self.total}
        self.share_sizes: dict[int, int] = {}
        """How many live GPU shares (not whole devices) have each memory size: the mix binpack packs for."""
        self.mig_holder: dict[str, str] = {}
        self.exclusive_on: dict[int, set[str]] = {g: set() for g in self.total}
        self.by_component: dict[str, set[str]] = {}
        self.unavailable: frozenset[int] = frozenset()
        self.foreign: dict[int, int] = {}
        self.cpus_used = 0

    def add(self, h: Holding) -> None:
        if h.group_id in self.holdings:
            raise ValueError(f"group {h.group_id!r} is already placed")
        self.holdings[h.group_id] = h
        self._account(h, 1)
        for user in h.users:
            self.by_component.setdefault(user, set()).add(h.group_id)

    def remove(self, group_id: str) -> Holding:
        h = self.holdings.pop(group_id)
        self._account(h, -1)
        for user in h.users:
            self._unindex(user, group_id)
        return h

    def _unindex(self, user: str, group_id: str) -> None:
        groups = self.by_component.get(user)
        if groups is not None:
            groups.discard(group_id)
            if not groups:
                del self.by_component[user]

    def _account(self, h: Holding, sign: int) -> None:
        """Over-capacity input (a restore after the machine changed) is counted, not refused."""
        self.cpus_used += sign * h.cpus
        for d in h.devices:
            if d.gpu not in self.total:
                continue
            if sign > 0:
                self.groups_on[d.gpu].add(h.group_id)
            else:
                self.groups_on[d.gpu].discard(h.group_id)
            if d.mig_uuid is not None:
                if sign > 0:
                    self.mig_holder[d.mig_uuid] = h.group_id
                elif self.mig_holder.get(d.mig_uuid) == h.group_id:
                    del self.mig_holder[d.mig_uuid]
                continue
            self.memory_used[d.gpu] += sign * d.memory_mib
            self.compute_used[d.gpu] += sign * d.compute_pct
            self.whole_on[d.gpu] += sign * d.whole
            if not d.whole:
                self._count_size(d.memory_mib, sign)
        if h.exclusive_domain:
            for g in h.exclusive_domain:
                if g in self.exclusive_on:
                    (self.exclusive_on[g].add if sign > 0 else self.exclusive_on[g].discard)(h.group_id)

    def _count_size(self, memory: int, sign: int) -> None:
        left = self.share_sizes.get(memory, 0) + sign
        if left > 0:
            self.share_sizes[memory] = left
        else:
            self.share_sizes.pop(memory, None)

    def set_unavailable(self, gpus: Iterable[int]) -> None:
        self.unavailable = frozenset(gpus)

    def set_foreign(self, memory_by_gpu: Mapping[int, int]) -> None:
        self.foreign = {g: int(m) for g, m in memory_by_gpu.items() if m > 0}

    def free_memory(self, gpu: int) -> int:
        return self.total[gpu] - self.memory_used[gpu] - self.foreign.get(gpu, 0)

    def free_compute(self, gpu: int) -> int:
        return 100 - self.compute_used[gpu]

    def gpus_of(self, component: str) -> set[int]:
        """Physical GPUs holding any device of a component's groups."""
        return {d.gpu for gid in self.by_component.get(component, ()) for d in self.holdings[gid].devices}
