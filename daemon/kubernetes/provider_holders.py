"""A group's objects on the cluster: its ResourceClaim and the holder pod that uses it.

Made and unmade here, for the provider and for attached components
(provider_attach.py): what one call creates is kept as `Made` (resource,
name, uid), so a call that gives up takes back exactly that.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim

from computegroups.daemon.kubernetes import cluster_objects as k
from computegroups.daemon.kubernetes.cluster_errors import ClusterError
from computegroups.daemon.model.claims import Claim

if TYPE_CHECKING:
    from computegroups.daemon.kubernetes.provider import KubernetesComputeResourceProvider

Json = Any
Made = tuple[Any, str, str]
"""An object one call created: (its lightkube resource, name, uid)."""


async def create_held(provider: KubernetesComputeResourceProvider, name: str, claim: Claim,
                      labels: Mapping[str, str], node: str | None, made: list[Made]) -> None:
    """The claim first, then its holder, each put in `made` once created: the caller
    takes back what it made when it gives up, and only that."""
    await gone(provider, name)
    ns = provider.namespace
    await create(provider, ResourceClaim, k.claim_object(name, ns, claim, provider.sharing, labels), made)
    await create(provider, Pod, k.holder_object(name, ns, provider.holder_image, labels, node), made)


async def create(provider: KubernetesComputeResourceProvider, res: Any, doc: Mapping[str, Json],
                 made: list[Made]) -> None:
    """Create one object and put it in `made`. A cancellation (Ctrl-C) while the request is out
    waits for its answer first: an object the server made must be in `made`, or the caller's
    cleanup could not take it back."""
    async def request() -> Made:
        async with provider.translated():
            created = await provider.client.create(res.from_dict(dict(doc)))
        return res, str(created.metadata.name), str(created.metadata.uid)

    answer = asyncio.ensure_future(request())
    try:
        made.append(await asyncio.shield(answer))
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            made.append(await answer)
        raise


async def delete_made(provider: KubernetesComputeResourceProvider, made: Sequence[Made]) -> None:
    """Delete what one call created, newest first, each with its uid as the delete's
    precondition: a call that fails, or is cancelled (Ctrl-C) while the scheduler has not
    allocated yet, leaves no claim or holder without an owner, and an object of the same
    name that it did not make (its create was refused for it) is never touched.
    lightkube's `delete` takes no preconditions, so this sends its request with the body."""
    generic = provider.client._client
    for res, name, uid in reversed(made):
        request = generic.prepare_request("delete", res, name=name, namespace=provider.namespace,
                                          params={"gracePeriodSeconds": 0})
        request.data = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        try:
            async with provider.translated():
                generic.raise_for_status(await generic.send(generic.build_adapter_request(request)))
        except ClusterError as exc:
            if exc.code not in ("not_found", "conflict"):  # gone already, or another's of that name
                raise


async def gone(provider: KubernetesComputeResourceProvider, name: str) -> None:
    """Wait until a claim of that name being deleted is gone. An allocated claim keeps its
    delete-protection finalizer until no pod uses it, so a name freed a moment ago may still
    be taken; a claim that is not on its way out is left to `create` to refuse."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + provider.allocation_timeout_s
    while True:
        try:
            async with provider.translated():
                found = (await provider.client.get(ResourceClaim, name, namespace=provider.namespace)).to_dict()
        except ClusterError as exc:
            if exc.code == "not_found":
                return
            raise
        if not found["metadata"].get("deletionTimestamp"):
            return
        if loop.time() >= deadline:
            raise ClusterError(409, "conflict", f"claim {name} is still being deleted: try again")
        await asyncio.sleep(provider.poll_s)


async def delete_held(provider: KubernetesComputeResourceProvider, name: str) -> bool:
    """Delete the holder, the claim and the group's taint rules; False when the claim was not there."""
    found = True
    for res, obj in ((Pod, k.holder_name(name)), (ResourceClaim, name)):
        try:
            async with provider.translated():
                await provider.client.delete(res, obj, namespace=provider.namespace, grace_period=0)
        except ClusterError as exc:
            if exc.code != "not_found":
                raise
            found = found and res is not ResourceClaim
    await provider.taints.undrain(name)
    return found
