"""Machines built by hand for the allocator tests and benchmark.

They mirror the simulated machine files in shape (NVLink counts, PCIe levels,
NUMA nodes, MIG) so the allocator can be tested before and apart from
discovery, and random ones feed the property tests.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import replace

from computegroups.daemon.placement.allocator import Allocator, Holding
from computegroups.topology.model import Gpu, Link, Machine, MigDevice, PcieLevel

PIX, PXB, PHB, NODE, SYS = (PcieLevel.SINGLE, PcieLevel.MULTIPLE, PcieLevel.HOSTBRIDGE,
                            PcieLevel.NODE, PcieLevel.SYSTEM)


def build(name: str, memory: list[int], nvlinks: dict[tuple[int, int], int],
          pcie: Callable[[int, int], PcieLevel | None], numa: Callable[[int], int | None] = lambda g: None,
          mig: dict[int, list[tuple[str, int]]] | None = None) -> Machine:
    gpus = []
    for i, mem in enumerate(memory):
        devices = tuple(
            MigDevice(uuid=f"MIG-{name}-{i}-{j}", profile=profile, memory_mib=mib, parent_index=i, index=j)
            for j, (profile, mib) in enumerate((mig or {}).get(i, []))
        )
        gpus.append(Gpu(index=i, uuid=f"GPU-{name}-{i}", name=name, pci_bus_id=f"0000:{i:02x}:00.0",
                        memory_mib=mem, numa_node=numa(i), mig_enabled=bool(devices), mig_devices=devices))
    links = []
    for a in range(len(memory)):
        for b in range(a + 1, len(memory)):
            nv = nvlinks.get((a, b), nvlinks.get((b, a), 0))
            level = pcie(a, b)
            if nv or level is not None:
                links.append(Link(a, b, nv, level))
    return Machine(hostname=name, gpus=tuple(gpus), links=tuple(links), source="test")


def dgx1_v100() -> Machine:
    """Hybrid cube mesh: two fully connected quads (NV1/NV2), joined GPU i to i+4 by NV2."""
    nv = {(0, 1): 1, (0, 2): 1, (0, 3): 2, (1, 2): 2, (1, 3): 1, (2, 3): 2,
          (4, 5): 1, (4, 6): 1, (4, 7): 2, (5, 6): 2, (5, 7): 1, (6, 7): 2,
          (0, 4): 2, (1, 5): 2, (2, 6): 1, (3, 7): 1}

    def pcie(a: int, b: int) -> PcieLevel:
        if a // 4 != b // 4:
            return SYS
        return PIX if a // 2 == b // 2 else NODE

    return build("dgx1-v100", [16160] * 8, nv, pcie, numa=lambda g: g // 4)


def nvswitch(count: int, links: int = 18, memory: int = 81559, per_switch: int = 2,
             per_numa: int = 4, name: str = "dgx-h100") -> Machine:
    """Every GPU to every GPU over NVSwitch; PCIe switches of `per_switch`, NUMA nodes of `per_numa`."""
    nv = {(a, b): links for a in range(count) for b in range(a + 1, count)}

    def pcie(a: int, b: int) -> PcieLevel:
        if a // per_switch == b // per_switch:
            return PXB
        return NODE if a // per_numa == b // per_numa else SYS

    return build(name, [memory] * count, nv, pcie, numa=lambda g: g // per_numa)


def a6000_workstation(count: int = 4) -> Machine:
    """PCIe-only workstation: NVLink bridges join GPU pairs (NV4); one NUMA node."""
    nv = {(a, a + 1): 4 for a in range(0, count - 1, 2)}
    return build("a6000x4", [49140] * count, nv, lambda a, b: PHB if a // 2 == b // 2 else NODE,
                 numa=lambda g: 0)


def a100_mig() -> Machine:
    """Four A100-40GB on NVSwitch; GPU 2 split into mixed MIG instances, GPU 3 into seven 1g.5gb."""
    mig = {2: [("3g.20gb", 20096), ("2g.10gb", 9856), ("1g.5gb", 4864)],
           3: [("1g.5gb", 4864)] * 7}
    return build("a100-mig", [40960] * 4, {(a, b): 12 for a in range(4) for b in range(a + 1, 4)},
                 lambda a, b: PXB if a // 2 == b // 2 else NODE, numa=lambda g: 0, mig=mig)


def islands(count: int, size: int, links: int = 18, name: str = "islands") -> Machine:
    """`count` NVSwitch islands of `size` GPUs; islands meet over the host (SYS)."""
    nv = {(a, b): links for a in range(count * size) for b in range(a + 1, count * size) if a // size == b // size}

    def pcie(a: int, b: int) -> PcieLevel:
        if a // size != b // size:
            return SYS
        return PXB if a // 2 == b // 2 else NODE

    return build(name, [81559] * (count * size), nv, pcie, numa=lambda g: g // size)


def random_machine(rng: random.Random, count: int | None = None) -> Machine:
    """Any shape: random NVLink counts, PCIe levels, NUMA nodes, sometimes unknown fields."""
    count = count if count is not None else rng.randint(1, 10)
    density = rng.random()
    nv = {(a, b): rng.choice([1, 2, 2, 4, 6]) for a in range(count) for b in range(a + 1, count)
          if rng.random() < density}
    levels = [PIX, PXB, PHB, NODE, SYS, None]
    table = {(a, b): rng.choice(levels) for a in range(count) for b in range(a + 1, count)}
    numa_nodes = rng.randint(1, 3)
    numa_known = rng.random() < 0.8
    memory = [rng.choice([16160, 24576, 40960, 81559]) for _ in range(count)]
    return build(f"random-{count}", memory, nv, lambda a, b: table[(min(a, b), max(a, b))],
                 numa=lambda g: (g * numa_nodes // count) if numa_known else None)


def follow(allocator: Allocator, holdings: Iterable[Holding]) -> None:
    """Hand the allocator a whole record of use, as cgd does from its state document."""
    allocator.follow({h.group_id: h for h in holdings})


def change(allocator: Allocator, gid: str, **fields: object) -> None:
    """One group's record changed (its users, a reservation taken): the allocator follows it."""
    held = {h.group_id: h for h in allocator.holdings()}
    held[gid] = replace(held[gid], **fields)  # type: ignore[arg-type]
    allocator.follow(held)
