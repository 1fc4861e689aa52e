"""cgd's event stream on a cluster: watches on the ResourceClaims and holder pods the provider made.

A cluster keeps no log of computegroups' events; what it keeps is each
object's changes, numbered by `resourceVersion` (etcd's revision: one
counter for every kind), which a watch replays from a version on while the
API server's watch cache still holds them. So an event here is a change of
one of our objects (label `app.kubernetes.io/managed-by: computegroups`)
read as cgd's event of the same meaning, its `seq` the change's
resourceVersion:

- a claim appears unallocated: `queued` (`reason` null);
- its holder's `PodScheduled` turns False, or its message changes: `queued`
  with the scheduler's `reason`;
- a claim's `status.allocation` is written: `placed` (`allocated` for a
  claim first seen allocated) with `gpus`, `devices` and `node`;
- a claim is deleted (its `deletionTimestamp` set, or it is gone): `released`;
- a container of a holder pod terminates: `worker_exited` with its
  `exit_code`, and `then` from the pod's restartPolicy.

A version older than the cache keeps is answered 410 Gone: the stream then
gives a `gap` event, as cgd does, and starts again from the objects as they
are now.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from computegroups.daemon.kubernetes import cluster_objects as k
from computegroups.daemon.kubernetes.cluster_errors import ClusterError

if TYPE_CHECKING:
    from computegroups.daemon.kubernetes.provider import KubernetesComputeResourceProvider

Json = Any
OURS: Any = k.selector()
"""The label selector of what the provider made."""
QUIET_S = 1.0
"""Without `follow`, a replay from `since` ends once the watches have been quiet this long:
a watch has no end of its own, and the list's version may belong to a change of another kind."""


class Gone(Exception):
    """The API server no longer keeps the changes after the version asked (410)."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class EventReader:
    """What one stream has said of each object, so each change says only what is new."""

    def __init__(self, provider: KubernetesComputeResourceProvider) -> None:
        self.provider = provider
        self.claims: dict[str, str] = {}
        """claim -> the last of queued/placed/released said of it."""
        self.reasons: dict[str, str] = {}
        """holder pod -> the scheduler's reason said last."""
        self.exits: dict[tuple[str, str], tuple[Json, ...]] = {}
        """(pod, container) -> the termination said last (restart count, finish time, code)."""
        self.devices: dict[tuple[str, str], dict[str, Json]] = {}

    async def _known_devices(self, claim: Mapping[str, Json]) -> dict[tuple[str, str], dict[str, Json]]:
        """The ResourceSlices' devices, read again when the claim names one not seen yet."""
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
        if any((r.get("pool"), r.get("device")) not in self.devices for r in results):
            self.devices = k.slice_devices(await self.provider._list(ResourceSlice, namespaced=False))
        return self.devices

    async def changed(self, res: Any, kind: str, obj: Mapping[str, Json], *,
                      now: bool = False) -> list[dict[str, Json]]:
        """The events one watched change of a `res` (ResourceClaim or Pod) means. `now`: the object
        as a fresh list shows it, where a container's past exit is not news."""
        if res is Pod:
            return self._pod(kind, obj, now)
        return await self._claim(kind, obj)

    async def _claim(self, kind: str, claim: Mapping[str, Json]) -> list[dict[str, Json]]:
        meta = claim.get("metadata") or {}
        name = str(meta.get("name"))
        labels = meta.get("labels") or {}
        said = self.claims.get(name)
        where = {"component": labels.get(k.COMPONENT), "group": name}
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            if said == "released":
                return []
            self.claims[name] = "released"
            return [_event(meta, "released", f"group {name} released (claim deleted)", **where)]
        if (claim.get("status") or {}).get("allocation"):
            if said == "placed":
                return []
            self.claims[name] = "placed"
            devices = k.allocated_devices(claim, await self._known_devices(claim))
            gpus = [d["index"] for d in devices]
            node = next((d["node"] for d in devices), None)
            type_ = "placed" if said == "queued" else "allocated"
            return [_event(meta, type_, f"group {name} {type_} on {node}: GPUs "
                           f"{', '.join(str(g) for g in gpus) or 'none'}",
                           **where, gpus=gpus, devices=devices, node=node)]
        if said is None:
            self.claims[name] = "queued"
            return [_event(meta, "queued", f"group {name} waits for the scheduler", **where, reason=None)]
        return []

    def _pod(self, kind: str, pod: Mapping[str, Json], now: bool) -> list[dict[str, Json]]:
        meta = pod.get("metadata") or {}
        name = str(meta.get("name"))
        labels = meta.get("labels") or {}
        where = {"component": labels.get(k.COMPONENT), "group": labels.get(k.GROUP),
                 "replica": int(labels[k.REPLICA]) if k.REPLICA in labels else None, "pod": name}
        if kind == "DELETED":
            self.reasons.pop(name, None)
            return []
        out = []
        reason = k.pod_reason(pod, ()) if not (pod.get("spec") or {}).get("nodeName") else None
        if reason is not None and self.reasons.get(name) != reason:
            self.reasons[name] = reason
            out.append(_event(meta, "queued", f"group {where['group']} waits: {reason}", **where, reason=reason))
        policy = (pod.get("spec") or {}).get("restartPolicy") or "Always"
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            ended = (status.get("state") or {}).get("terminated") or (status.get("lastState") or {}).get("terminated")
            if not ended:
                continue
            key = (name, str(status.get("name")))
            mark = (status.get("restartCount"), ended.get("finishedAt"), ended.get("exitCode"))
            if self.exits.get(key) == mark:
                continue
            self.exits[key] = mark
            if now:
                continue
            code = ended.get("exitCode")
            then = "restart" if policy == "Always" or (policy == "OnFailure" and code != 0) else \
                "complete" if code == 0 else "fail"
            out.append(_event(meta, "worker_exited", f"{name}: container {status.get('name')} exited with "
                              f"code {code} ({ended.get('reason') or 'terminated'}); then {then}",
                              **where, container=status.get("name"), pid=None, shim_pid=None,
                              exit_code=code, signal=None, then=then))
        return out


def _event(meta: Mapping[str, Json], type_: str, message: str, **what: Json) -> dict[str, Json]:
    """cgd's Event shape; a cluster has no unix owner (`uid`, `user` null)."""
    version = meta.get("resourceVersion")
    return {"seq": int(str(version)) if str(version or "").isdigit() else None, "time": time.time(), "type": type_,
            "uid": None, "user": None, **what, "message": message}


def _gap(since: int, message: str) -> dict[str, Json]:
    return {"seq": None, "time": time.time(), "type": "gap", "uid": None, "user": None,
            "after": since, "next": None, "message": message}


async def cluster_events(provider: KubernetesComputeResourceProvider, since: int | None,
                         follow: bool) -> AsyncIterator[dict[str, Json]]:
    """`events()` on a cluster. `since` None (or 0): the groups as they are now, then (with
    `follow`) each change; `since` a `seq` seen: the changes after it that the API server
    still keeps, or a `gap` and the groups as they are now."""
    if since is not None and (isinstance(since, bool) or since < 0):
        raise ValueError(f"since: a resourceVersion (a seq this stream gave), got {since!r}")
    reader = EventReader(provider)
    version = str(since) if since else None
    while True:
        if version is None:
            snapshot, version = await _snapshot(reader)
            for event in snapshot:
                yield event
            if not follow:
                return
        try:
            async for event in _watch(reader, version, follow):
                yield event
            return
        except Gone as exc:
            yield _gap(int(version), f"the API server no longer keeps the changes after {version} ({exc.message}): "
                       "the groups as they are now follow")
            version = None


async def _snapshot(reader: EventReader) -> tuple[list[dict[str, Json]], str]:
    """The objects as one list shows them, read as events, and the version to watch on from."""
    provider = reader.provider
    out: list[dict[str, Json]] = []
    versions = []
    kinds: tuple[Any, ...] = (ResourceClaim, Pod)
    for res in kinds:
        async with provider.translated():
            found: Any = provider.client.list(res, namespace=provider.namespace, labels=OURS)
            objects = [o.to_dict() async for o in found]
            versions.append(int(found.resourceVersion))
        for obj in sorted(objects, key=lambda o: int(o["metadata"].get("resourceVersion") or 0)):
            out.extend(await reader.changed(res, "ADDED", obj, now=True))
    return out, str(min(versions))


async def _watch(reader: EventReader, version: str, follow: bool) -> AsyncIterator[dict[str, Json]]:
    """Both kinds' watches from `version`, their changes as events in the order they come."""
    provider = reader.provider
    queue: asyncio.Queue[tuple[Any, str, dict[str, Json]] | BaseException] = asyncio.Queue()

    async def watch(res: Any) -> None:
        try:
            async with provider.translated():
                async for kind, obj in provider.client.watch(res, namespace=provider.namespace,
                                                              labels=OURS, resource_version=version):
                    await queue.put((res, kind, obj.to_dict()))
        except Exception as exc:  # to the reader, which raises it in the caller's task
            await queue.put(exc)

    tasks = [asyncio.ensure_future(watch(res)) for res in (ResourceClaim, Pod)]
    try:
        while True:
            try:
                item = await (queue.get() if follow else asyncio.wait_for(queue.get(), QUIET_S))
            except asyncio.TimeoutError:
                return
            if isinstance(item, ClusterError) and item.status == 410:
                raise Gone(item.message)
            if isinstance(item, BaseException):
                raise item
            for event in await reader.changed(*item):
                yield event
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
