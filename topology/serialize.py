"""The machine as JSON: what `cgctl --json topo` prints and `GET /v1/machine` serves.

One conversion for both so the two never drift; keys are stable and listed
in docs/api.md. `machine_from_dict` reads it back (a client that got the
machine from the daemon works with the same model as the daemon).
"""

from __future__ import annotations

import itertools
from typing import Any

from computegroups.topology.model import Gpu, Link, LostGpu, Machine, MigDevice, PcieLevel, components


def machine_to_dict(machine: Machine) -> dict[str, Any]:
    numa: dict[str, list[int]] = {}
    for g in machine.gpus:
        if g.numa_node is not None:
            numa.setdefault(str(g.numa_node), []).append(g.index)
    return {
        "hostname": machine.hostname,
        "source": machine.source,
        "driver_version": machine.driver_version,
        "cuda_driver_version": machine.cuda_driver_version,
        "nvswitch": machine.has_nvswitch,
        "nvswitch_fabrics": [sorted(fabric) for fabric in machine.nvswitch_fabrics],
        "gpus": [_gpu_to_dict(g) for g in machine.gpus],
        "links": [
            {"a": link.a, "b": link.b, "nvlinks": link.nvlinks,
             "pcie": link.pcie.label if link.pcie is not None else None}
            for link in (machine.link(a.index, b.index) for a, b in itertools.combinations(machine.gpus, 2))
        ],
        "nvlink_islands": [sorted(island) for island in machine.nvlink_islands],
        "numa_nodes": {str(node): numa.get(str(node), []) for node in machine.numa_nodes},
        "lost_gpus": [{"index": g.index, "uuid": g.uuid, "reason": g.reason} for g in machine.lost_gpus],
        "cpus": list(machine.cpus),
    }


def _gpu_to_dict(g: Gpu) -> dict[str, Any]:
    return {
        "index": g.index,
        "uuid": g.uuid,
        "name": g.name,
        "memory_mib": g.memory_mib,
        "numa_node": g.numa_node,
        "pci_bus_id": g.pci_bus_id,
        "compute_capability": (f"{g.compute_capability[0]}.{g.compute_capability[1]}"
                               if g.compute_capability is not None else None),
        "cpu_affinity": list(g.cpu_affinity) if g.cpu_affinity is not None else None,
        "multiprocessors": g.multiprocessors,
        "mig_enabled": g.mig_enabled,
        "nvswitch_links": g.nvswitch_links,
        "mig_devices": [
            {"uuid": m.uuid, "profile": m.profile, "memory_mib": m.memory_mib, "index": m.index,
             "gpu_instance_id": m.gpu_instance_id, "compute_instance_id": m.compute_instance_id,
             "slices": m.slices}
            for m in g.mig_devices
        ],
    }


def machine_from_dict(data: dict[str, Any]) -> Machine:
    """The inverse of `machine_to_dict`; raises KeyError/ValueError on a foreign shape."""
    gpus = tuple(
        Gpu(
            index=d["index"], uuid=d["uuid"], name=d["name"], pci_bus_id=d["pci_bus_id"],
            memory_mib=d["memory_mib"],
            compute_capability=(tuple(int(p) for p in d["compute_capability"].split("."))  # type: ignore[arg-type]
                                if d["compute_capability"] else None),
            numa_node=d["numa_node"],
            cpu_affinity=tuple(d["cpu_affinity"]) if d["cpu_affinity"] is not None else None,
            mig_enabled=d.get("mig_enabled", False),
            mig_devices=tuple(
                MigDevice(uuid=m["uuid"], profile=m["profile"], memory_mib=m["memory_mib"],
                          parent_index=d["index"], index=m.get("index", k),
                          gpu_instance_id=m.get("gpu_instance_id"),
                          compute_instance_id=m.get("compute_instance_id"), slices=m.get("slices"))
                for k, m in enumerate(d["mig_devices"])
            ),
            multiprocessors=d.get("multiprocessors"),
            nvswitch_links=d.get("nvswitch_links", 0),
        )
        for d in data["gpus"]
    )
    links = tuple(
        Link(link["a"], link["b"], link["nvlinks"],
             PcieLevel.from_label(link["pcie"]) if link["pcie"] is not None else None)
        for link in data["links"]
    )
    return Machine(
        hostname=data["hostname"], gpus=gpus, links=links,
        driver_version=data["driver_version"], cuda_driver_version=data["cuda_driver_version"],
        numa_nodes=tuple(sorted(int(n) for n in data["numa_nodes"])),
        lost_gpus=tuple(LostGpu(g["index"], g["reason"], g["uuid"]) for g in data["lost_gpus"]),
        source=data["source"],
        cpus=tuple(data.get("cpus") or ()),
        nvswitch_fabrics=_fabrics(data, gpus, links),
    )


def _fabrics(data: dict[str, Any], gpus: tuple[Gpu, ...], links: tuple[Link, ...]) -> tuple[frozenset[int], ...]:
    """The fabrics as served; a cgd older than them is read the best way its document allows: the
    GPUs on a switch, one fabric per NVLink island."""
    if "nvswitch_fabrics" in data:
        return tuple(frozenset(fabric) for fabric in data["nvswitch_fabrics"])
    switched = {g.index for g in gpus if g.nvswitch_links}
    joined = {(link.a, link.b) for link in links if link.nvlinks}
    return components(tuple(sorted(switched)), lambda a, b: (a, b) in joined)
