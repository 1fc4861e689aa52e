"""Allocate, inspect and free compute groups from Python through cgd.

Run it against a daemon on a simulated machine:

    cgd --simulate dgx-h100 --socket /tmp/cg.sock --state-dir /tmp/cg-state --log-dir /tmp/cg-logs &
    python docs/examples/client_example.py /tmp/cg.sock

Without an argument it uses the default socket (`$CG_SOCKET`, else the
user or system socket), like `cgctl`.
"""

from __future__ import annotations

import asyncio
import sys

from computegroups.daemon.client import CgdError, ComputeGroupManager, LocalComputeResourceProvider


async def main(socket_path: str | None) -> None:
    manager = ComputeGroupManager(LocalComputeResourceProvider(socket_path))

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
        print(f"  {g.id} on {g.topology['gpu_indices']}, memory in use {g.utilization['memory']:.0%}")

    summary = await manager.get_allocation_summary()
    print(f"allocated {summary['memory_allocated_mib'] // 1024} of {summary['memory_mib'] // 1024} GiB")

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


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None))
