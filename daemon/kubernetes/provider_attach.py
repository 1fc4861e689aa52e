"""Components attached to a group made on its own: one holder pod per replica on the group's claim.

DRA shares an allocated claim among the pods that reference it, so each
replica's holder pod uses the group's claim and the group's capacity is
counted once for all its users, as on cgd. Kept apart from the provider,
which calls these with itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lightkube.resources.core_v1 import Pod

from computegroups.daemon.kubernetes import cluster_objects as k
from computegroups.daemon.kubernetes.cluster_errors import ClusterError
from computegroups.daemon.kubernetes.provider_holders import Made, create, delete_made

if TYPE_CHECKING:
    from computegroups.daemon.kubernetes.provider import KubernetesComputeResourceProvider

Json = Any


async def attached(provider: KubernetesComputeResourceProvider, component_name: str) -> list[dict[str, Json]]:
    """The holder pods of a component attached to a group made on its own, one per replica."""
    found = await provider._list(Pod, labels=k.selector(**{k.COMPONENT: component_name, k.ATTACHED: "true"}))
    return [p for p in found if not p["metadata"].get("deletionTimestamp")]


async def attach(provider: KubernetesComputeResourceProvider, component_name: str, group_id: str,
                 replicas: int) -> dict[str, Json]:
    """Every replica attaches to the group, all of them or none: a pod refused, an error or a
    cancellation takes back the pods this call made (by uid), and nothing else."""
    if replicas < 1:
        raise ValueError(f"replicas: must be at least 1, got {replicas}")
    group = await provider.get_group(group_id)
    if group["owner"]:
        raise ClusterError(409, "conflict", f"group {group_id!r} belongs to component {group['owner']!r}: "
                           "only a group made on its own (create_compute_group) takes users by id")
    who = ", ".join(f"{component_name}/{i}" for i in range(replicas))
    if group["state"] == "draining":
        raise ClusterError(409, "conflict", f"group {group_id!r} is draining: nothing new attaches to it "
                           f"({who}); delete its DeviceTaintRules to undrain it")
    if group["state"] != "allocated":
        raise ClusterError(409, "conflict", f"group {group_id!r} is {group['state']}: nothing attaches to "
                           f"it before the scheduler allocates it ({group['explanation']})")
    await provider._check_new(component_name)
    made: list[Made] = []
    try:
        for i in range(replicas):
            pod = k.user_holder_object(component_name, i, group_id, provider.namespace, provider.holder_image)
            await create(provider, Pod, pod, made)
        return k.component_document(component_name, [await provider.get_group(group_id)], range(replicas))
    except BaseException:
        await delete_made(provider, made)
        raise


async def detach(provider: KubernetesComputeResourceProvider, component_name: str,
                 resource_ids: Sequence[str]) -> bool:
    """An attached component gives back its holder pods; the group stays, as on cgd."""
    holders = await attached(provider, component_name)
    if not holders:
        return False
    used = {p["metadata"]["labels"][k.GROUP] for p in holders}
    missing = set(resource_ids) - used
    if missing:
        raise ValueError(f"{', '.join(sorted(missing))}: not groups of {component_name}")
    for p in holders:
        try:
            async with provider.translated():
                await provider.client.delete(Pod, p["metadata"]["name"], namespace=provider.namespace,
                                             grace_period=0)
        except ClusterError as exc:
            if exc.code != "not_found":
                raise
    return True
