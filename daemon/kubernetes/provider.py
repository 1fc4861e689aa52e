"""`KubernetesComputeResourceProvider`: the manager's API on a cluster, through DRA.

A group is a `ResourceClaim` (resource.k8s.io/v1) labelled
`app.kubernetes.io/managed-by: computegroups`, with a holder pod that uses
it: the scheduler allocates only claims that a pod references, so the
holder is the cluster's form of cgd's reservation. Devices are what the
scheduler wrote in `status.allocation`; nothing of the allocation is kept
here, every answer is read from the API server.

Its parts beside it: the claims and holders one call makes and takes back
(provider_holders.py), components attached to a group (provider_attach.py),
drains as DeviceTaintRules (provider_taints.py), the event stream as
watches (provider_events.py).

Imported only by callers that ask for a cluster: it needs lightkube, the
`kubernetes` extra (`pip install 'computegroups[kubernetes]'`;
`computegroups.daemon.kubernetes.provider_class()` says so where it is missing).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from computegroups.daemon.client.providers import ComputeResourceProvider
from computegroups.daemon.kubernetes import cluster_objects as k
from computegroups.daemon.kubernetes.cluster_errors import ClusterError
from computegroups.daemon.kubernetes.cluster_filters import checked_filters, matches
from computegroups.daemon.kubernetes.provider_attach import attach, attached, detach
from computegroups.daemon.kubernetes.provider_client import load_config, translated
from computegroups.daemon.kubernetes.provider_events import cluster_events
from computegroups.daemon.kubernetes.provider_holders import Made, create_held, delete_held, delete_made
from computegroups.daemon.kubernetes.provider_taints import FIELD_MANAGER, DeviceTaints
from computegroups.daemon.kubernetes.render_claims import SHARINGS
from computegroups.daemon.model.claims import Claim

Json = Any
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
ALLOCATE_KEYS = frozenset({"claim", "group", "replicas", "scope", "wait"})


class KubernetesComputeResourceProvider(ComputeResourceProvider):
    """A cluster with NVIDIA's DRA driver, one namespace of it.

    `client`: a lightkube `AsyncClient` (tests, or a caller with its own);
    without one, the kubeconfig at `kubeconfig`/`context` as kubectl finds it.
    `allocation_timeout_s`: how long an allocation waits for the scheduler
    before answering a pending group with the scheduler's reason.
    `sharing`: how a share is claimed, as in `cgctl render kubernetes`:
    `dra` (consumable capacity) or `mps` (NVIDIA's MPS `GpuConfig`).
    """

    def __init__(self, client: AsyncClient | None = None, *, namespace: str | None = None,
                 context: str | None = None, kubeconfig: str | os.PathLike[str] | None = None,
                 allocation_timeout_s: float = 60.0, holder_image: str = PAUSE_IMAGE,
                 sharing: str = "dra", poll_s: float = 0.2) -> None:
        if sharing not in SHARINGS:
            raise ValueError(f"sharing: must be one of {', '.join(SHARINGS)}, got {sharing!r}")
        if client is None:
            client = AsyncClient(config=load_config(kubeconfig, context), namespace=namespace,
                                 field_manager=FIELD_MANAGER)
        self.client = client
        self.namespace: str = namespace or client.namespace
        self.allocation_timeout_s = allocation_timeout_s
        self.holder_image = holder_image
        self.sharing = sharing
        self.poll_s = poll_s
        self.taints = DeviceTaints(self)

    async def close(self) -> None:
        await self.client.close()

    @property
    def server(self) -> str | None:
        """The API server's URL, as the kubeconfig (or the caller's client) gives it."""
        cluster = getattr(getattr(self.client, "config", None), "cluster", None)
        return getattr(cluster, "server", None)

    def translated(self) -> AbstractAsyncContextManager[None]:
        """`translated` for calls to this provider's API server, naming it when it is silent."""
        return translated(self.server)

    # -- reading the cluster ---------------------------------------------------

    async def _list(self, res: Any, *, namespaced: bool = True,
                    labels: Mapping[str, str] | None = None) -> list[dict[str, Json]]:
        async with self.translated():
            found = self.client.list(res, namespace=self.namespace if namespaced else None,
                                     labels=dict(labels) if labels else None)
            return [o.to_dict() async for o in found]

    async def _devices(self) -> dict[tuple[str, str], dict[str, Json]]:
        return k.slice_devices(await self._list(ResourceSlice, namespaced=False))

    async def _claims(self, **labels: str) -> list[dict[str, Json]]:
        """Ours, and not on their way out (a claim being deleted waits for its finalizer)."""
        found = await self._list(ResourceClaim, labels=k.selector(**labels))
        return [c for c in found if (c.get("metadata") or {}).get("labels", {}).get(k.MANAGED_BY) == k.MANAGER
                and not c["metadata"].get("deletionTimestamp")]

    async def taint_rule_version(self) -> str | None:
        """The resource.k8s.io version that serves DeviceTaintRule (provider_taints.py); None if none does."""
        return await self.taints.version()

    async def _holders(self) -> list[dict[str, Json]]:
        """Every holder pod of ours: the groups' own, and those of components attached to a group."""
        return await self._list(Pod, labels=k.selector())

    async def _reasons(self, claims: Sequence[Mapping[str, Json]],
                       holders: Sequence[Mapping[str, Json]]) -> dict[str, str | None]:
        """Why each unallocated claim waits, from its holder pod and the pod's events."""
        waiting = [c["metadata"]["name"] for c in claims if not (c.get("status") or {}).get("allocation")]
        if not waiting:
            return {}
        pods = {p["metadata"]["name"]: p for p in holders}
        async with self.translated():
            events = [e.to_dict() async for e in self.client.list(
                Event, namespace=self.namespace, fields={"involvedObject.kind": "Pod"})]
        reasons = {}
        for name in waiting:
            holder = k.holder_name(name)
            mine = [e for e in events if (e.get("involvedObject") or {}).get("name") == holder]
            reasons[name] = k.pod_reason(pods.get(holder), mine)
        return reasons

    async def _groups(self, claims: Sequence[Mapping[str, Json]]) -> list[dict[str, Json]]:
        devices, rules, holders = await asyncio.gather(self._devices(), self.taints.rules(), self._holders())
        reasons = await self._reasons(claims, holders)
        drained, _ = k.drained_devices(rules)
        users = k.attached_users(holders)
        groups = []
        for c in claims:
            name = c["metadata"]["name"]
            group = k.group_document(c, devices, name in drained, reasons.get(name), users.get(name, ()))
            group["warnings"] = k.check_claim(group["claim"])
            groups.append(group)
        return sorted(groups, key=lambda g: g["id"])

    # -- ComputeResourceProvider ---------------------------------------------

    async def discover_resources(self) -> dict[str, Json]:
        nodes, devices = await asyncio.gather(self._list(Node, namespaced=False), self._devices())
        return {"nodes": k.machines(nodes, devices)}

    async def get_resource_state(self) -> dict[str, Json]:
        devices, claims, rules = await asyncio.gather(self._devices(), self._claims(), self.taints.rules())
        groups = await self._groups(claims)
        _, covered = k.drained_devices(rules)
        return {"node": self.client.config.context_name or "cluster",
                "gpus": k.gpu_statuses(devices, groups, covered), "lost_groups": []}

    async def allocate_resources(self, component_name: str, resources: Mapping[str, Json]) -> dict[str, Json]:
        """Claims (one per replica, or one for `scope: all-replicas`) and their holders.

        Answers the Component once the scheduler has allocated every claim,
        or after `allocation_timeout_s` in state `scheduling` with the
        scheduler's reason; with `wait`, only once allocated, however long
        (salloc). Until it answers, a failure or a cancellation takes back
        the claims and holders it made: a waiting claim whose asker is
        gone goes, as cgd drops a queued claim that is not detached."""
        extra = sorted(set(resources) - ALLOCATE_KEYS)
        if "cpu_bind" in extra:
            raise ValueError("cpu_bind: not supported by the Kubernetes provider (CPU placement near the GPUs is "
                             "the kubelet's CPU and topology managers' policy on a cluster)")
        if extra:
            raise ValueError(f"{extra[0]}: not supported by the Kubernetes provider, which only allocates "
                             "(run work on a cluster as a deployment: cgctl --kubernetes apply)")
        if resources.get("group") is not None:
            if "claim" in resources:
                raise ValueError(f"claim: not allowed with group: the groups come from {resources['group']!r}")
            return await attach(self, component_name, str(resources["group"]), int(resources.get("replicas") or 1))
        if "claim" not in resources:
            raise ValueError("claim: required by the Kubernetes provider (or group; no share_with or shadow_of)")
        claim = self._checked(resources["claim"])
        scope = resources.get("scope") or "per-replica"
        if scope not in ("per-replica", "all-replicas"):
            raise ValueError(f"scope: must be per-replica or all-replicas, got {scope!r}")
        await self._check_new(component_name)
        await self._check_fits(claim)
        count = int(resources.get("replicas") or 1) if scope == "per-replica" else 1
        names = [f"{component_name}-{i}" for i in range(count)]
        made: list[Made] = []
        try:
            for i, name in enumerate(names):
                labels = k.managed_labels(**{k.COMPONENT: component_name, k.REPLICA: str(i), k.SCOPE: scope})
                await create_held(self, name, claim, labels, None, made)
            groups = await self._wait_allocated(names, None if resources.get("wait") else self.allocation_timeout_s)
        except BaseException:  # all or nothing, as on cgd (provider_holders.delete_made)
            await delete_made(self, made)
            raise
        return k.component_document(component_name, groups)

    async def _check_new(self, component_name: str) -> None:
        claims, holders = await asyncio.gather(self._claims(**{k.COMPONENT: component_name}),
                                               attached(self, component_name))
        if claims or holders:
            raise ClusterError(409, "conflict", f"component {component_name} already exists")

    def _checked(self, claim: Mapping[str, Json]) -> Claim:
        """The claim as cgd would read it (same model, same refusals), then what has no cluster form."""
        normal = Claim.from_dict(dict(claim))
        k.check_claim(normal.to_dict())
        return normal

    async def _check_fits(self, claim: Claim) -> None:
        if not k.fits_somewhere(claim.to_dict(), await self._devices()):
            raise ClusterError(422, "unsatisfiable", f"no node of the cluster has devices for "
                               f"{claim.to_dict()} (NVIDIA DRA ResourceSlices)")

    async def _wait_allocated(self, names: Sequence[str], timeout: float | None) -> list[dict[str, Json]]:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            claims = [c for c in await self._claims() if c["metadata"]["name"] in names]
            done = all((c.get("status") or {}).get("allocation") for c in claims)
            if done or (deadline is not None and loop.time() >= deadline):
                return await self._groups(claims)
            await asyncio.sleep(self.poll_s)

    async def deallocate_resources(self, component_name: str, resource_ids: Sequence[str]) -> bool:
        """Each group is a claim of its own, so some of a component's groups may go alone.
        A component attached to a group made on its own gives back its holder pods; the
        group stays, as on cgd."""
        owned = {c["metadata"]["name"] for c in await self._claims(**{k.COMPONENT: component_name})}
        if not owned:
            return await detach(self, component_name, resource_ids)
        missing = set(resource_ids) - owned
        if missing:
            raise ValueError(f"{', '.join(sorted(missing))}: not groups of {component_name}")
        for name in sorted(resource_ids or owned):
            await delete_held(self, name)
        return True

    async def list_groups(self, filters: Mapping[str, Json]) -> list[dict[str, Json]]:
        """cgd's filters, read from the claims and their devices (cluster_filters.py); `pool` is refused."""
        wanted = checked_filters(filters)
        labels = {k.DEPLOYMENT: str(wanted["deployment"])} if "deployment" in wanted else {}
        return [g for g in await self._groups(await self._claims(**labels)) if matches(g, wanted)]

    async def _claim(self, group_id: str) -> dict[str, Json]:
        try:
            async with self.translated():
                claim: dict[str, Json] = (await self.client.get(
                    ResourceClaim, group_id, namespace=self.namespace)).to_dict()
        except ClusterError as exc:
            if exc.code == "not_found":
                raise ClusterError(404, "not_found", f"no group {group_id} in namespace {self.namespace}") from None
            raise
        if (claim.get("metadata") or {}).get("labels", {}).get(k.MANAGED_BY) != k.MANAGER:
            raise ClusterError(404, "not_found", f"{group_id} is a ResourceClaim computegroups did not make")
        return claim

    async def get_group(self, group_id: str) -> dict[str, Json]:
        (group,) = await self._groups([await self._claim(group_id)])
        return group

    async def create_group(self, claim: Mapping[str, Json], node_id: str | None) -> dict[str, Json]:
        normal = self._checked(claim)
        await self._check_fits(normal)
        name = f"group-{secrets.token_hex(4)}"
        made: list[Made] = []
        try:
            await create_held(self, name, normal, k.managed_labels(), node_id, made)
            (group,) = await self._wait_allocated([name], self.allocation_timeout_s)
        except BaseException:  # as allocate_resources
            await delete_made(self, made)
            raise
        return group

    async def _claim_or_none(self, group_id: str) -> dict[str, Json] | None:
        """The group's claim, or None where there is none (delete and deallocate then answer False)."""
        try:
            return await self._claim(group_id)
        except ClusterError as exc:
            if exc.code == "not_found":
                return None
            raise

    async def delete_group(self, group_id: str) -> bool:
        claim = await self._claim_or_none(group_id)
        if claim is None:
            return False
        owner = claim["metadata"].get("labels", {}).get(k.COMPONENT)
        if owner:
            raise ClusterError(409, "conflict", f"{group_id} belongs to component {owner}: deallocate that")
        await self._check_unused(group_id)
        return await delete_held(self, group_id)

    async def _check_unused(self, group_id: str) -> None:
        """A group made on its own goes only once no component attached to it uses it (cgd's rule)."""
        users = k.attached_users(await self._holders()).get(group_id)
        if users:
            names = sorted({c for c, _ in users})
            raise ClusterError(409, "conflict", f"group {group_id!r} is in use by "
                               f"{', '.join(repr(c) for c in names)} ({', '.join(f'{c}/{i}' for c, i in users)}): "
                               f"release {'it' if len(names) == 1 else 'them'} first")

    async def deallocate_group(self, group_id: str) -> bool:
        """On a cluster each group is a claim of its own with its own holder pod, so one group is
        freed alone, whoever it belongs to: its claim and holder are deleted. A group made on
        its own is refused while a component attached to it uses it, as `delete_group` is."""
        claim = await self._claim_or_none(group_id)
        if claim is None:
            return False
        if not claim["metadata"].get("labels", {}).get(k.COMPONENT):
            await self._check_unused(group_id)
        return await delete_held(self, group_id)

    async def drain_group(self, group_id: str) -> dict[str, Json]:
        """A NoSchedule DeviceTaintRule per device of the group (provider_taints.py)."""
        if await self.taint_rule_version() is not None:
            group = await self.get_group(group_id)
            if not group["devices"]:
                raise ClusterError(409, "conflict", f"{group_id} has no devices yet: {group['explanation']}")
            await self.taints.drain(group)
        else:
            await self.taints.drain({"id": group_id, "devices": []})  # refused, in words
        return await self.get_group(group_id)

    async def list_components(self) -> list[dict[str, Json]]:
        """The owners of claims, and the components attached to a group made on its own."""
        per: dict[str, list[dict[str, Json]]] = {}
        attached: dict[str, list[int]] = {}
        for g in await self._groups(await self._claims()):
            if g["owner"]:
                per.setdefault(g["owner"], []).append(g)
            for user in g["users"] if not g["owner"] else ():
                name, replica = user.rsplit("/", 1)
                per.setdefault(name, [g])
                attached.setdefault(name, []).append(int(replica))
        return [k.component_document(name, groups, attached.get(name, ())) for name, groups in sorted(per.items())]

    def events(self, since: int | None, follow: bool) -> AsyncIterator[dict[str, Json]]:
        """The claims' and holder pods' changes as cgd's events (provider_events.py); `since`
        is a resourceVersion, as docs/kubernetes.md says."""
        return cluster_events(self, since, follow)

    async def wait_component(self, component_name: str, until: str, timeout: float | None) -> dict[str, Json]:
        if until != "placed":
            raise ValueError(f"until={until!r}: the Kubernetes provider runs no jobs; only 'placed' is waited for")
        names = [c["metadata"]["name"] for c in await self._claims(**{k.COMPONENT: component_name})]
        if not names:
            for component in await self.list_components():
                if component["name"] == component_name:  # attached to an allocated group: placed already
                    return component
            raise ClusterError(404, "not_found", f"no component {component_name} in namespace {self.namespace}")
        groups = await self._wait_allocated(names, timeout)
        component = k.component_document(component_name, groups)
        if component["state"] != "allocated":
            raise TimeoutError(f"{component_name} was not placed within {timeout:g}s: {component['explanation']}")
        return component
