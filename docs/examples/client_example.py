"""Allocate, inspect and free compute groups from Python, on any provider.

Run it against a daemon on a simulated machine:

    cgd --simulate dgx-h100 --socket /tmp/cg.sock --state-dir /tmp/cg-state --log-dir /tmp/cg-logs &
    python docs/examples/client_example.py /tmp/cg.sock

Without an argument it uses the default socket (`$CG_SOCKET`, else the
user or system socket), like `cgctl`. `run(manager)` is the example itself:
the same steps on a cluster take a manager over the Kubernetes provider
(docs/client.md):

    from computegroups.daemon.kubernetes.provider import KubernetesComputeResourceProvider
    asyncio.run(run(ComputeGroupManager(KubernetesComputeResourceProvider())))
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from computegroups.daemon.client import CgdError, ComputeGroup, ComputeGroupManager, LocalComputeResourceProvider


def shape(group: ComputeGroup) -> dict[str, Any]:
    """What a group is, whatever the provider: its owner, its devices and their shares."""
    return {"component": group.component,
            "devices": sorted((d.get("memory_mib"), d.get("compute_pct")) for d in group.devices)}


async def run(manager: ComputeGroupManager) -> list[dict[str, Any]]:
    """The example's steps; answers the shapes of the groups it held, to compare providers by."""
    (node,) = await manager.list_compute_nodes()
    print(f"node {node.id}: {node.resources['gpus']} GPUs, {node.resources['memory_mib'] // 1024} GiB")

    # Two whole GPUs on one NVLink island for each of two replicas.
    group = await manager.allocate_compute_group(
        "example-train", {"gpus": 2}, {"colocate": "nvlink", "replicas": 2})
    print(f"{group.id}: GPUs {group.topology['gpu_indices']} ({group.allocation_state})")

    # A 20 GiB, 30 % share of one GPU, owned by no component.
    share = await manager.create_compute_group({"memory_mib": 20 * 1024, "compute_pct": 30})
    print(f"{share.id}: {share.resources['devices']}")

    for g in await manager.get_component_allocations("example-train"):
        use = g.utilization  # what is handed out, and what NVML measured (None before a sample)
        busy = "not sampled yet" if use["gpu_utilization"] is None else f"{use['gpu_utilization']:.0%} busy"
        print(f"  {g.id} on {g.topology['gpu_indices']}: memory {use['memory_allocated']:.0%} allocated, {busy}")

    summary = await manager.get_allocation_summary()
    print(f"allocated {summary['memory_allocated_mib'] // 1024} of {summary['memory_mib'] // 1024} GiB")
    held = sorted((shape(g) for g in await manager.list_compute_groups()), key=repr)

    try:
        await manager.allocate_compute_group("example-huge", {"gpus": 64})
    except CgdError as exc:
        print(f"refused as expected ({exc.code}): {exc.message}")

    # A component attaches to the share by its id; while it does, the share cannot be deleted.
    await manager.allocate_compute_group("example-cache", {}, {"group": share.id})

    await manager.deallocate_compute_group("example-train-1")  # the last replica's group: scales in to 1
    await manager.deallocate_compute_group(group.id)  # its only replica now: the component is released
    await manager.provider.deallocate_resources("example-cache", [])
    await manager.delete_compute_group(share.id)
    print("released")
    return held


async def main(socket_path: str | None) -> None:
    await run(ComputeGroupManager(LocalComputeResourceProvider(socket_path)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None))
