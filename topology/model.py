"""The machine as the rest of computegroups sees it.

Everything here is frozen: discovery builds a `Machine` once and every layer
above (allocator, manager, CLI) reads it without fear of it changing under
them. Fields NVML could not tell are `None`, never a guess, so that a field a
GPU does not support degrades that field alone.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property


class PcieLevel(enum.IntEnum):
    """Closest common ancestor of two GPUs on the PCIe tree.

    The values are NVML's `NVML_TOPOLOGY_*` constants so discovery can map
    them directly; lower is closer.
    """

    INTERNAL = 0
    SINGLE = 10
    MULTIPLE = 20
    HOSTBRIDGE = 30
    NODE = 40
    SYSTEM = 50

    @property
    def label(self) -> str:
        """The short name `nvidia-smi topo -m` prints."""
        return _PCIE_LABELS[self]

    @classmethod
    def from_label(cls, text: str) -> PcieLevel:
        """Accept both the nvidia-smi label (PIX) and the NVML name (SINGLE)."""
        key = text.strip().upper()
        for level, label in _PCIE_LABELS.items():
            if key in (label, level.name):
                return level
        raise ValueError(
            f"unknown PCIe level {text!r}: use one of "
            + ", ".join(_PCIE_LABELS.values())
        )


_PCIE_LABELS = {
    PcieLevel.INTERNAL: "INT",
    PcieLevel.SINGLE: "PIX",
    PcieLevel.MULTIPLE: "PXB",
    PcieLevel.HOSTBRIDGE: "PHB",
    PcieLevel.NODE: "NODE",
    PcieLevel.SYSTEM: "SYS",
}


class DomainKind(str, enum.Enum):
    """Topology units a claim can be colocated in or made exclusive over."""

    NVLINK = "nvlink"
    PCIE = "pcie"
    NUMA = "numa"
    MACHINE = "machine"


@dataclass(frozen=True)
class MigDevice:
    """A MIG instance: a device of its own for CUDA_VISIBLE_DEVICES (`MIG-<uuid>`)."""

    uuid: str
    profile: str
    memory_mib: int | None
    parent_index: int
    index: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    slices: int | None = None


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    pci_bus_id: str
    memory_mib: int | None
    compute_capability: tuple[int, int] | None = None
    numa_node: int | None = None
    cpu_affinity: tuple[int, ...] | None = None
    mig_enabled: bool | None = False
    mig_devices: tuple[MigDevice, ...] = ()
    multiprocessors: int | None = None
    nvswitch_links: int = 0


@dataclass(frozen=True)
class LostGpu:
    """A GPU NVML counted but that vanished or failed during discovery."""

    index: int
    reason: str
    uuid: str | None = None


@dataclass(frozen=True)
class Link:
    """How two GPUs talk: NVLink lanes (0 = none) and their PCIe relation."""

    a: int
    b: int
    nvlinks: int
    pcie: PcieLevel | None

    def __post_init__(self) -> None:
        if self.a >= self.b:
            raise ValueError(f"link endpoints must be ordered a < b, got {self.a}, {self.b}")
        if self.nvlinks < 0:
            raise ValueError(f"negative NVLink count on {self.a}-{self.b}")

    @property
    def label(self) -> str:
        """The cell of a `nvidia-smi topo -m` style matrix."""
        if self.nvlinks:
            return f"NV{self.nvlinks}"
        return self.pcie.label if self.pcie is not None else "?"


Domain = frozenset[int]


@dataclass(frozen=True)
class Machine:
    hostname: str
    gpus: tuple[Gpu, ...]
    links: tuple[Link, ...]
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    numa_nodes: tuple[int, ...] = ()
    lost_gpus: tuple[LostGpu, ...] = ()
    source: str = "nvml"
    cpus: tuple[int, ...] = ()
    """The machine's logical CPUs: what CPU-only claims count against."""
    nvswitch_fabrics: tuple[Domain, ...] = ()
    """The GPUs behind each NVSwitch fabric (GPUs that share a switch, transitively); two fabrics
    on one box reach each other only over PCIe, so "has NVSwitch" alone says too little."""
    _link_index: dict[tuple[int, int], Link] = field(
        init=False, repr=False, compare=False, hash=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        indices = [g.index for g in self.gpus]
        if len(set(indices)) != len(indices):
            raise ValueError("duplicate GPU index in machine")
        known = set(indices)
        for link in self.links:
            if link.a not in known or link.b not in known:
                raise ValueError(f"link {link.a}-{link.b} names a GPU that is not present")
            if (link.a, link.b) in self._link_index:
                raise ValueError(f"two links given for GPUs {link.a}-{link.b}")
            self._link_index[(link.a, link.b)] = link

    def gpu(self, index: int) -> Gpu:
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(f"no GPU {index} on {self.hostname}")

    @cached_property
    def indices(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus)

    def link(self, a: int, b: int) -> Link:
        """The link between two distinct GPUs; a pair discovery could not read
        is reported as no NVLink and unknown PCIe rather than missing."""
        if a == b:
            raise ValueError("a GPU has no link to itself")
        lo, hi = (a, b) if a < b else (b, a)
        found = self._link_index.get((lo, hi))
        return found if found is not None else Link(lo, hi, 0, None)

    def nvlinks(self, a: int, b: int) -> int:
        return self.link(a, b).nvlinks

    @cached_property
    def link_matrix(self) -> tuple[tuple[Link | None, ...], ...]:
        """Row/column per GPU in `gpus` order; the diagonal is None."""
        return tuple(
            tuple(None if g.index == h.index else self.link(g.index, h.index) for h in self.gpus)
            for g in self.gpus
        )

    @property
    def has_nvswitch(self) -> bool:
        return bool(self.nvswitch_fabrics)

    @cached_property
    def nvlink_islands(self) -> tuple[Domain, ...]:
        """Connected components over NVLink; a GPU without NVLink is an island of one."""
        return components(self.indices, lambda a, b: self.nvlinks(a, b) > 0)

    @cached_property
    def pcie_switches(self) -> tuple[Domain, ...]:
        """GPUs reachable from each other without crossing a host bridge."""
        return components(
            self.indices,
            lambda a, b: (p := self.link(a, b).pcie) is not None and p <= PcieLevel.MULTIPLE,
        )

    @cached_property
    def gpus_by_numa(self) -> dict[int | None, tuple[int, ...]]:
        out: dict[int | None, list[int]] = {}
        for g in self.gpus:
            out.setdefault(g.numa_node, []).append(g.index)
        return {k: tuple(v) for k, v in out.items()}

    def domains(self, kind: DomainKind) -> tuple[Domain, ...]:
        """Every domain of a kind, each as the set of GPU indices in it."""
        if kind is DomainKind.NVLINK:
            return self.nvlink_islands
        if kind is DomainKind.PCIE:
            return self.pcie_switches
        if kind is DomainKind.NUMA:
            return tuple(frozenset(v) for v in self.gpus_by_numa.values())
        return (frozenset(self.indices),) if self.gpus else ()

    def domain_of(self, kind: DomainKind, index: int) -> Domain:
        for dom in self.domains(kind):
            if index in dom:
                return dom
        raise KeyError(f"GPU {index} is in no {kind.value} domain")

    @cached_property
    def fingerprint(self) -> tuple[str, ...]:
        """The GPU UUIDs in index order: state written for another box is recognised."""
        return tuple(g.uuid for g in self.gpus)

    def mig_device(self, uuid: str) -> MigDevice:
        for g in self.gpus:
            for m in g.mig_devices:
                if m.uuid == uuid:
                    return m
        raise KeyError(f"no MIG device {uuid}")


def components(nodes: tuple[int, ...], joined: Callable[[int, int], bool]) -> tuple[Domain, ...]:
    """The connected components of `nodes` under `joined`, each sorted by its smallest member."""
    parent = {n: n for n in nodes}

    def find(n: int) -> int:
        while parent[n] != n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for a, b in itertools.combinations(nodes, 2):
        if joined(a, b):
            parent[find(a)] = find(b)
    groups: dict[int, set[int]] = {}
    for n in nodes:
        groups.setdefault(find(n), set()).add(n)
    return tuple(sorted((frozenset(s) for s in groups.values()), key=min))
