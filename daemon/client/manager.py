"""`ComputeGroupManager`: the API for programs that schedule work, over any provider.

The manager holds no state of its own: every call asks the provider, so two
managers (or a manager and `cgctl`) never disagree about what is allocated.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from typing import Any

from computegroups.daemon.client.models import ComputeGroup, ComputeNode
from computegroups.daemon.client.providers import (
    ComputeResourceProvider,
    LocalComputeResourceProvider,
)

Json = Any

# Keys of a ComponentRequest that are about the component, not about where
# its groups go; any other constraint is a placement rule of the claim.
COMPONENT_KEYS = frozenset({
    "replicas", "scope", "share_with", "shadow_of", "group", "command", "shell", "env",
    "cwd", "restart", "stop_timeout_s", "lease", "time_limit_s", "wait", "detach", "cpu_bind",
})


class ComputeGroupManager:
    """Allocate, inspect, drain and free compute groups.

    `ComputeGroupManager()` talks to the local cgd on its default socket; pass
    `LocalComputeResourceProvider(socket_path)` for another one, or any other
    `ComputeResourceProvider`.
    """

    def __init__(self, provider: ComputeResourceProvider | None = None) -> None:
        self.provider = provider if provider is not None else LocalComputeResourceProvider()

    async def _gpus(self) -> list[Mapping[str, Json]]:
        return list((await self.provider.get_resource_state())["gpus"])

    async def list_compute_nodes(self) -> list[ComputeNode]:
        found, gpus, groups = await asyncio.gather(
            self.provider.discover_resources(), self._gpus(), self.provider.list_groups({}))
        compute_groups = [ComputeGroup.from_documents(g, gpus) for g in groups]
        return [ComputeNode(node["machine"], gpus, compute_groups) for node in found["nodes"]]

    async def list_compute_groups(self, filters: Mapping[str, Json] | None = None) -> list[ComputeGroup]:
        """Filters (all must match): `component` (owns or uses it), `state`, `gpu` (an index), `model` (a glob
        over the GPU model), `pool` (all its devices in that pool), `uuid` (of a GPU or MIG device), `owner`
        (as the group names it), `deployment`."""
        groups, gpus = await asyncio.gather(self.provider.list_groups(dict(filters or {})), self._gpus())
        return [ComputeGroup.from_documents(g, gpus) for g in groups]

    async def get_compute_group(self, group_id: str) -> ComputeGroup:
        group, gpus = await asyncio.gather(self.provider.get_group(group_id), self._gpus())
        return ComputeGroup.from_documents(group, gpus)

    async def create_compute_group(self, resources: Mapping[str, Json],
                                   node_id: str | None = None) -> ComputeGroup:
        """`resources` is a Claim (`{"gpus": 2}`, `{"memory_mib": 20480}`...):
        the group belongs to no component until one shares it."""
        group = await self.provider.create_group(resources, node_id)
        return ComputeGroup.from_documents(group, await self._gpus())

    async def delete_compute_group(self, group_id: str) -> bool:
        return await self.provider.delete_group(group_id)

    async def allocate_compute_group(self, component_name: str, resource_requirements: Mapping[str, Json],
                                     constraints: Mapping[str, Json] | None = None) -> ComputeGroup:
        """Create the component and answer the group of its first replica.

        `resource_requirements` and the placement keys of `constraints`
        (`strategy`, `colocate`, `gpu_ids`...) form the Claim; the component
        keys of `constraints` (`replicas`, `scope`, `command`...) go beside
        it. The other replicas' groups: `get_component_allocations`.
        """
        constraints = dict(constraints or {})
        claim = dict(resource_requirements)
        clash = sorted(set(claim) & set(constraints))
        if clash:
            raise ValueError(f"{clash[0]!r} is given both as a requirement and as a constraint")
        body = {k: v for k, v in constraints.items() if k in COMPONENT_KEYS}
        claim.update({k: v for k, v in constraints.items() if k not in COMPONENT_KEYS})
        if claim:
            body["claim"] = claim
        if body.get("detach"):
            raise ValueError("detach: a detached claim has no group to answer yet; use submit_job")
        component = await self.provider.allocate_resources(component_name, body)
        if component.get("state") == "pending":  # queued ("wait": true): wait for its turn, like salloc
            component = await self.provider.wait_component(component_name, "placed", None)
        return await self.get_compute_group(component["replicas"][0]["group"])

    async def submit_job(self, component_name: str, resource_requirements: Mapping[str, Json],
                         command: list[str], constraints: Mapping[str, Json] | None = None) -> dict[str, Json]:
        """Queue a job, like sbatch: it runs `command` once its claim fits, restarted only on failure
        unless `constraints` says otherwise (`restart`, `time_limit_s`...); answers the Component (maybe
        `pending`). It stays queued when this process ends; `wait_job` waits for its end."""
        constraints = {"wait": True, "detach": True, **dict(constraints or {}), "command": list(command)}
        claim = {**resource_requirements, **{k: v for k, v in constraints.items() if k not in COMPONENT_KEYS}}
        body = {k: v for k, v in constraints.items() if k in COMPONENT_KEYS}
        body["claim"] = claim
        return await self.provider.allocate_resources(component_name, body)

    async def wait_job(self, component_name: str, timeout: float | None = None) -> dict[str, Json]:
        """The Component once it has ended for good (`completed`, `failed`, `timeout`), with its
        `exit_code`; raises TimeoutError after `timeout` seconds."""
        return await self.provider.wait_component(component_name, "ended", timeout)

    async def deallocate_compute_group(self, group_id: str) -> bool:
        """Free one group where that is meaningful; False when there is no such group.

        A group made by `create_compute_group` is deleted (refused while a
        component uses it); the group of a component's last replica scales
        the component in by that replica (its only replica, or an all-replicas
        group: the component is released); a reservation's is released with
        it. A middle replica's group, or a deployment's, is refused with a
        `CgdError` that says what to change instead.
        """
        return await self.provider.deallocate_group(group_id)

    async def drain_compute_group(self, group_id: str) -> bool:
        await self.provider.drain_group(group_id)
        return True

    def events(self, since: int | None = None, follow: bool = True) -> AsyncIterator[dict[str, Json]]:
        """What happens on the machine, as it happens: `async for event in manager.events(): ...`.

        Each event is a dict (`seq`, `time`, `type`, `user`, `message`, and
        what the type names: docs/api.md, Events); you see the events of
        your own components and of the machine (root sees all). The kept
        events after `since` come first (all kept ones without it); with
        `follow=False` the iterator ends there; following, it outlives a
        restart of cgd and reads on after the last event it gave (a `gap`
        event says when some were missed). In a new iterator, pass the last
        `seq` you saw as `since`. On a cluster (the Kubernetes provider) the
        events are those of the groups the provider made, and `seq`/`since`
        are resourceVersions (docs/kubernetes.md, Events on a cluster).
        """
        return self.provider.events(since, follow)

    async def get_allocation_summary(self) -> dict[str, Json]:
        """Totals per machine, groups per state and what each component holds."""
        state, groups, components = await asyncio.gather(
            self.provider.get_resource_state(), self.provider.list_groups({}),
            self.provider.list_components())
        gpus = state["gpus"]
        return {
            "node": state["node"],
            "gpus": len(gpus),
            "gpus_drained": [g["index"] for g in gpus if g.get("drained")],
            "memory_mib": sum(g.get("memory_mib") or 0 for g in gpus),
            "memory_allocated_mib": sum(g.get("memory_allocated_mib") or 0 for g in gpus),
            "memory_foreign_mib": sum(g.get("memory_foreign_mib") or 0 for g in gpus),
            "compute_allocated_pct": sum(g.get("compute_allocated_pct") or 0 for g in gpus),
            "groups_by_state": dict(Counter(g.get("state", "unknown") for g in groups)),
            "components": {
                c["name"]: {
                    "state": c.get("state"),
                    "replicas": len(c.get("replicas") or []),
                    "groups": sorted({gid for r in c.get("replicas") or [] for gid in r.get("groups") or [r["group"]]}),
                }
                for c in components
            },
            "lost_groups": [g["id"] for g in state.get("lost_groups", [])],
        }

    async def get_component_allocations(self, component_name: str) -> list[ComputeGroup]:
        return await self.list_compute_groups({"component": component_name})
