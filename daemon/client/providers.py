"""Where compute comes from: one provider per environment.

`ComputeGroupManager` speaks only to this interface, so the Kubernetes
provider (computegroups.daemon.kubernetes.provider, an optional extra this
package never imports) sits beside the local one without the manager or its
callers changing. The seed's four operations are kept; the group-level ones below
them are what the manager needs to offer the seed's group API.

Providers deal in plain documents shaped as in docs/api.md (Group,
Component, GpuStatus); the manager turns them into `ComputeGroup` and
`ComputeNode`.
"""

from __future__ import annotations

import asyncio
import os
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from typing import Any

from computegroups.daemon.client.aio import AsyncCgdClient
from computegroups.daemon.client.errors import CgdError, CgdUnreachable
from computegroups.daemon.client.sync import DEFAULT_TIMEOUT_S

POLL_S = 30.0
"""One long poll's length: well inside the client's socket timeout."""

Json = Any
GROUP_FILTERS = ("component", "state", "gpu", "model", "pool", "uuid", "owner", "deployment")


class ComputeResourceProvider(ABC):
    """One environment's way to find, hand out and take back compute."""

    @abstractmethod
    async def discover_resources(self) -> dict[str, Json]:
        """`{"nodes": [{"id", "machine"}]}`: the machines and what is in them."""

    @abstractmethod
    async def allocate_resources(self, component_name: str, resources: Mapping[str, Json]) -> dict[str, Json]:
        """Create a component from a ComponentRequest body without its name; answer the Component."""

    @abstractmethod
    async def deallocate_resources(self, component_name: str, resource_ids: Sequence[str]) -> bool:
        """Give back a component's groups; False when the component is not there."""

    @abstractmethod
    async def get_resource_state(self) -> dict[str, Json]:
        """`{"node", "gpus": [GpuStatus], "lost_groups": [Group]}`: how used each GPU is."""

    @abstractmethod
    async def list_groups(self, filters: Mapping[str, Json]) -> list[dict[str, Json]]:
        """Groups matching every filter (keys from `GROUP_FILTERS`)."""

    @abstractmethod
    async def get_group(self, group_id: str) -> dict[str, Json]:
        """One group; raises when there is none."""

    @abstractmethod
    async def create_group(self, claim: Mapping[str, Json], node_id: str | None) -> dict[str, Json]:
        """A group that belongs to no component."""

    @abstractmethod
    async def delete_group(self, group_id: str) -> bool:
        """Release a group made by `create_group`; False when it is not there."""

    @abstractmethod
    async def deallocate_group(self, group_id: str) -> bool:
        """Free one group where that means something (see docs/api.md); False when it is not there."""

    @abstractmethod
    async def drain_group(self, group_id: str) -> dict[str, Json]:
        """Stop new work landing on the group's devices; answer the group."""

    @abstractmethod
    async def list_components(self) -> list[dict[str, Json]]:
        """Every component visible to the caller."""

    @abstractmethod
    async def wait_component(self, component_name: str, until: str, timeout: float | None) -> dict[str, Json]:
        """The Component once it is placed (`until="placed"`) or has ended for good (`"ended"`).

        Raises TimeoutError after `timeout` seconds (None: no limit)."""


    def events(self, since: int | None, follow: bool) -> AsyncIterator[dict[str, Json]]:
        """What happens, as it happens (see docs/api.md, Events). Not abstract: a provider
        without an event stream refuses it in words rather than failing to be built."""
        raise NotImplementedError(f"{type(self).__name__} has no event stream")


class LocalComputeResourceProvider(ComputeResourceProvider):
    """This machine, through cgd: state files, circus and CUDA_VISIBLE_DEVICES
    are the daemon's business, so this only translates calls to its API."""

    def __init__(self, socket_path: str | os.PathLike[str] | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.cgd = AsyncCgdClient(socket_path, timeout)

    async def _node_id(self) -> str:
        version = await self.cgd.version()
        return str(version["machine"]["hostname"])

    async def discover_resources(self) -> dict[str, Json]:
        machine = await self.cgd.machine()
        return {"nodes": [{"id": str(machine.get("hostname") or "localhost"), "machine": machine}]}

    async def allocate_resources(self, component_name: str, resources: Mapping[str, Json]) -> dict[str, Json]:
        return dict(await self.cgd.create_component({**resources, "name": component_name}))

    async def deallocate_resources(self, component_name: str, resource_ids: Sequence[str]) -> bool:
        """cgd places and frees a component's groups all together, so asking to
        free only some of them is refused rather than silently widened."""
        try:
            if resource_ids:
                owned = {g["id"] for g in await self.list_groups({"component": component_name})}
                missing = set(resource_ids) - owned
                if missing:
                    raise ValueError(f"{', '.join(sorted(missing))}: not groups of {component_name}")
                if owned - set(resource_ids):
                    raise ValueError(
                        f"{component_name} holds {', '.join(sorted(owned))}: the local provider frees a "
                        "component's groups together; pass them all, or scale the component down")
            await self.cgd.release_component(component_name)
        except CgdError as exc:
            if exc.code == "not_found":
                return False
            raise
        return True

    async def get_resource_state(self) -> dict[str, Json]:
        status, node = await asyncio.gather(self.cgd.status(), self._node_id())
        return {"node": node, "gpus": status["gpus"], "lost_groups": status.get("lost_groups", [])}

    async def list_groups(self, filters: Mapping[str, Json]) -> list[dict[str, Json]]:
        unknown = sorted(set(filters) - set(GROUP_FILTERS))
        if unknown:
            raise ValueError(f"unknown filter {unknown[0]!r}: use {', '.join(GROUP_FILTERS)}")
        return list((await self.cgd.list_groups(**filters))["groups"])

    async def get_group(self, group_id: str) -> dict[str, Json]:
        return dict(await self.cgd.get_group(group_id))

    async def create_group(self, claim: Mapping[str, Json], node_id: str | None) -> dict[str, Json]:
        if node_id is not None and node_id != await self._node_id():
            raise ValueError(f"node {node_id!r} is not this machine: the local provider has one node")
        return dict(await self.cgd.create_group(dict(claim)))

    async def delete_group(self, group_id: str) -> bool:
        return await _found(self.cgd.delete_group(group_id))

    async def deallocate_group(self, group_id: str) -> bool:
        return await _found(self.cgd.deallocate_group(group_id))

    async def drain_group(self, group_id: str) -> dict[str, Json]:
        return dict(await self.cgd.drain_group(group_id))

    async def list_components(self) -> list[dict[str, Json]]:
        return list((await self.cgd.list_components())["components"])

    def events(self, since: int | None, follow: bool) -> AsyncIterator[dict[str, Json]]:
        return self.cgd.events(since, follow)

    async def wait_component(self, component_name: str, until: str, timeout: float | None) -> dict[str, Json]:
        """Long polls of at most `POLL_S` each, so a socket timeout never cuts one and a restarted cgd is
        asked again (the wait goes on across a restart: the queue is durable)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            left = POLL_S if deadline is None else min(POLL_S, max(0.0, deadline - loop.time()))
            try:
                answer = await self.cgd.wait_component(component_name, until, left)
            except CgdUnreachable:
                if deadline is not None and loop.time() >= deadline:
                    raise
                await asyncio.sleep(0.2)  # cgd restarting: ask again, as cgctl does
                continue
            if answer["reached"]:
                return dict(answer["component"])
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError(f"{component_name} was not {until} within {timeout:g}s")


async def _found(request: Awaitable[Any]) -> bool:
    """The provider's answer to a request about a group: False when cgd has no such group."""
    try:
        await request
    except CgdError as exc:
        if exc.code == "not_found":
            return False
        raise
    return True
