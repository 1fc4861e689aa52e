"""The machine file as written: msgspec structs that check every value where it is written.

The rules between fields (GPUs named exist, MIG instances fit, ids are
unique) are small functions beside them, and `MachineFile.expand` turns the
compact form into a fully explicit `MachineSpec`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from computegroups.topology.machinespec import MAX_GPUS, GpuSpec, MachineSpec, MigSpec, PortSpec
from computegroups.topology.model import PcieLevel
from computegroups.topology.ranges import parse_ranges

_INDICES = 'indices like "0-3,6" or a list of integers'
_VERSION = '"MAJOR.MINOR" like "12.4" or NVML\'s 12040'
_CAPABILITY = '"MAJOR.MINOR" like "9.0"'
_BUS_RE = re.compile(r"^\s*([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])\s*$")
_PAIR_RE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")

Text = Annotated[str, Meta(pattern=r"\S", description="a non-empty string")]
Count = Annotated[int, Meta(ge=0)]
Positive = Annotated[int, Meta(ge=1)]
BusId = Annotated[str, Meta(pattern=_BUS_RE.pattern, description="a PCI bus id like 0000:1a:00.0")]
Indices = Annotated[str, Meta(description=_INDICES)] | Count | list[Count]
# A tuple, not a list: with msgspec 0.22, `str` with a pattern or'd with a
# `list` in this model crashed the interpreter at exit about one run in five.
Capability = Annotated[str, Meta(pattern=r"^\s*\d+\.\d+\s*$", description=_CAPABILITY)] | tuple[Count, Count]
CudaVersion = (Annotated[str, Meta(pattern=r"^\s*\d+\.\d\s*$", description=_VERSION)]
               | Annotated[int, Meta(ge=1000, description=_VERSION)])


class _Table(msgspec.Struct, forbid_unknown_fields=True):
    """A TOML table: a misspelt key is an error, never silently ignored."""


class FileRuleBroken(Exception):
    """A rule between fields is broken; the loader adds the file's name."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class MigEntry(_Table):
    """With `count`, `gpu_instance_id` is the first of consecutive ids, the
    way NVML numbers a row of same-sized instances."""

    profile: Text
    memory_mib: Positive
    count: Positive = 1
    gpu_instance_id: Count | None = None
    compute_instance_id: Count = 0
    multiprocessors: Positive | None = None
    slices: Positive | None = None


class GpuDefaults(_Table):
    """The GPU template; every field unset (None) here is left to overrides or defaults."""

    name: Text | None = None
    memory_mib: Positive | None = None
    compute_capability: Capability | None = None
    multiprocessors: Positive | None = None
    cpu_affinity: Indices | None = None
    mig_capable: bool | None = None
    mig: list[MigEntry] | None = None
    nvlink_ports: Count | None = None
    temperature_c: Count | None = None
    unsupported: list[Text] | None = None


class GpuOverride(GpuDefaults):
    """`[gpus.N]`: what only one GPU can have is allowed here (for one GPU)."""

    uuid: Text | None = None
    pci_bus_id: BusId | None = None


class NumaNode(_Table):
    node: Count | None = None
    cpus: Indices | None = None
    gpus: Indices = []


class Pcie(_Table):
    same_numa: Text = "NODE"
    cross_numa: Text = "SYS"
    groups: dict[str, list[Indices]] = {}
    pairs: dict[str, Text] = {}

    def levels(self, count: int, numa: Mapping[int, int]) -> dict[tuple[int, int], PcieLevel]:
        """The NUMA rule, then groups (closest level wins), then explicit pairs."""
        same = _level(self.same_numa, "pcie.same_numa")
        cross = _level(self.cross_numa, "pcie.cross_numa")
        levels: dict[tuple[int, int], PcieLevel] = {}
        for a in range(count):
            for b in range(a + 1, count):
                levels[(a, b)] = same if a in numa and numa.get(a) == numa.get(b) else cross
        grouped: dict[tuple[int, int], PcieLevel] = {}
        for label, groups in self.groups.items():
            level = _level(label, f"pcie.groups.{label}")
            for k, group in enumerate(groups):
                for pair in _pairs_of(_indices(group, f"pcie.groups.{label}[{k}]", count)):
                    grouped[pair] = min(level, grouped.get(pair, level))
        levels.update(grouped)
        for key, label in self.pairs.items():
            path = f"pcie.pairs.{key}"
            levels[_pair(key, path, count)] = _level(label, path)
        return levels


class NvLinkMesh(_Table):
    links: Positive
    gpus: Indices = []


class NvLink(_Table):
    pairs: dict[str, Count] = {}
    mesh: list[NvLinkMesh] = []

    def links(self, count: int) -> dict[tuple[int, int], int]:
        """Direct links per GPU pair; an explicit pair overrides the mesh."""
        links: dict[tuple[int, int], int] = {}
        for m, mesh in enumerate(self.mesh):
            for pair in _pairs_of(_indices(mesh.gpus, f"nvlink.mesh[{m}].gpus", count)):
                links[pair] = mesh.links
        for key, n in self.pairs.items():
            links[_pair(key, f"nvlink.pairs.{key}", count)] = n
        return {p: n for p, n in links.items() if n}


class NvSwitch(_Table):
    gpus: Indices
    links_per_switch: Annotated[list[Count], Meta(min_length=1)]
    pci_bus_ids: list[BusId] | None = None
    overrides: dict[str, list[Count]] = {}

    def bus_ids(self, where: str, first: int) -> list[str]:
        """Given ids, else made-up ones from 0xE0 on, numbered across fabrics."""
        if self.pci_bus_ids is None:
            return [f"00000000:{0xE0 + (first + k) % 0x20:02X}:00.0" for k in range(len(self.links_per_switch))]
        if len(self.pci_bus_ids) != len(self.links_per_switch):
            raise FileRuleBroken(f"{where}.pci_bus_ids", f"expected {len(self.links_per_switch)}, one per switch")
        return [normalize_bus_id(b) for b in self.pci_bus_ids]

    def ports(self, where: str, count: int, fabric: list[str]) -> dict[int, list[PortSpec]]:
        """Each member GPU's switch ports, switch by switch."""
        per_gpu = {g: self.links_per_switch for g in _indices(self.gpus, f"{where}.gpus", count)}
        for key, counts in self.overrides.items():
            path = f"{where}.overrides.{key}"
            for g in _indices(key, path, count):
                if g not in per_gpu:
                    raise FileRuleBroken(path, f"GPU {g} is not in this switch fabric's gpus")
                if len(counts) != len(fabric):
                    raise FileRuleBroken(path, f"expected {len(fabric)} link counts, one per switch")
                per_gpu[g] = counts
        return {g: [PortSpec(bus, True) for bus, n in zip(fabric, counts, strict=True) for _ in range(n)]
                for g, counts in per_gpu.items()}


class Simulate(_Table):
    """`[simulate]`: what the fake driver makes up about cgd's workers.

    Unset, the simulated GPUs show only the processes of the fault file; set,
    every running worker of the cgd using this machine is listed on the GPUs
    its CUDA_VISIBLE_DEVICES names, with this much memory and utilization,
    so measured values are real numbers in tests (the fault file can change
    them per GPU while cgd runs).
    """

    worker_memory_mib: Count | None = None
    worker_utilization_pct: Annotated[int, Meta(ge=0, le=100)] | None = None


class MachineFile(_Table):
    gpu_count: Annotated[int, Meta(ge=0, le=MAX_GPUS, description=f"the number of GPUs, 0 (none) to {MAX_GPUS}")]
    name: Text | None = None
    hostname: Text | None = None
    driver_version: Text | None = None
    cuda_driver_version: CudaVersion | None = None
    pci_bus_ids: list[BusId] | None = None
    gpu_defaults: GpuDefaults = msgspec.field(default_factory=GpuDefaults)
    gpus: dict[str, GpuOverride] = {}
    numa: list[NumaNode] = []
    pcie: Pcie = msgspec.field(default_factory=Pcie)
    nvlink: NvLink = msgspec.field(default_factory=NvLink)
    nvswitch: list[NvSwitch] = []
    simulate: Simulate = msgspec.field(default_factory=Simulate)

    def expand(self, label: str, default_name: str) -> MachineSpec:
        """Every GPU spelled out; raises FileRuleBroken for a broken rule between fields."""
        count = self.gpu_count
        name = self.name or default_name
        fields = self.gpu_fields()
        numa, cpus = self.numa_nodes()
        bus_ids = self.gpu_bus_ids(fields)
        switch_bus: list[str] = []
        switch_ports: dict[int, list[PortSpec]] = {}
        for f, fabric in enumerate(self.nvswitch):
            buses = fabric.bus_ids(f"nvswitch[{f}]", len(switch_bus))
            for g, ports in fabric.ports(f"nvswitch[{f}]", count, buses).items():
                switch_ports.setdefault(g, []).extend(ports)
            switch_bus.extend(buses)
        taken = set(bus_ids)
        for bus in switch_bus:
            if bus in taken:
                raise FileRuleBroken("nvswitch", f"PCI bus id {bus} is used twice")
            taken.add(bus)
        direct = self.nvlink.links(count)
        pcie = self.pcie.levels(count, numa)
        gpus = tuple(
            _gpu(i, fields[i], name, bus_ids, numa.get(i), cpus.get(i), switch_ports.get(i, []), direct)
            for i in range(count)
        )
        _check_unique_uuids(gpus)
        return MachineSpec(name, label, self.hostname or name, self.driver_version,
                           _cuda_version(self.cuda_driver_version), gpus, pcie, tuple(switch_bus),
                           worker_memory_mib=self.simulate.worker_memory_mib,
                           worker_utilization_pct=self.simulate.worker_utilization_pct)

    def gpu_fields(self) -> list[dict[str, tuple[Any, str]]]:
        """Template, then overrides in file order; each value keeps the path it came from."""
        fields = [{k: (v, f"gpu_defaults.{k}") for k, v in _set_fields(self.gpu_defaults)}
                  for _ in range(self.gpu_count)]
        for key, override in self.gpus.items():
            where = f"gpus[{key}]"
            targets = _indices(key, where, self.gpu_count)
            given = _set_fields(override)
            for k, _ in given:
                if k in ("uuid", "pci_bus_id") and len(targets) > 1:
                    raise FileRuleBroken(f"{where}.{k}", "set only for a single GPU ([gpus.N]), not for a range")
            for i in targets:
                fields[i].update({k: (v, f"{where}.{k}") for k, v in given})
        return fields

    def numa_nodes(self) -> tuple[dict[int, int], dict[int, tuple[int, ...]]]:
        """Each GPU's node and CPUs; a node is listed once, a GPU on one node."""
        node_of: dict[int, int] = {}
        cpus_of: dict[int, tuple[int, ...]] = {}
        seen: set[int] = set()
        for n, entry in enumerate(self.numa):
            where = f"numa[{n}]"
            node = n if entry.node is None else entry.node
            if node in seen:
                raise FileRuleBroken(f"{where}.node", f"NUMA node {node} is listed twice")
            seen.add(node)
            cpus = () if entry.cpus is None else _indices(entry.cpus, f"{where}.cpus")
            for g in _indices(entry.gpus, f"{where}.gpus", self.gpu_count):
                if g in node_of:
                    raise FileRuleBroken(f"{where}.gpus", f"GPU {g} is already on NUMA node {node_of[g]}")
                node_of[g] = node
                if cpus:
                    cpus_of[g] = cpus
        return node_of, cpus_of

    def gpu_bus_ids(self, fields: list[dict[str, tuple[Any, str]]]) -> list[str]:
        """Top-level list, per-GPU overrides over it; made-up distinct ids when absent."""
        count = self.gpu_count
        if self.pci_bus_ids is None:
            ids = [f"{i // 16:08X}:{0x10 + (i % 16) * 0x0C:02X}:00.0" for i in range(count)]
        elif len(self.pci_bus_ids) != count:
            raise FileRuleBroken("pci_bus_ids", f"expected {count} bus ids, one per GPU, got {len(self.pci_bus_ids)}")
        else:
            ids = [normalize_bus_id(b) for b in self.pci_bus_ids]
        for i, f in enumerate(fields):
            if "pci_bus_id" in f:
                ids[i] = normalize_bus_id(f["pci_bus_id"][0])
        for i, bus in enumerate(ids):
            if bus in ids[:i]:
                raise FileRuleBroken(f"gpus[{i}].pci_bus_id", f"{bus} is also GPU {ids.index(bus)}'s")
        return ids


# -- the rules between fields ---------------------------------------------------
def normalize_bus_id(text: str) -> str:
    """NVML's form, `00000000:1A:00.0`, so file ids compare with reported ones."""
    m = _BUS_RE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a PCI bus id like 0000:1a:00.0")
    dom, bus, dev, fn = m.groups()
    return f"{int(dom, 16):08X}:{bus.upper()}:{dev.upper()}.{fn}"


def _set_fields(table: msgspec.Struct) -> list[tuple[str, Any]]:
    return [(k, v) for k in table.__struct_fields__ if (v := getattr(table, k)) is not None]


def _indices(value: str | int | list[int], path: str, limit: int | None = None) -> tuple[int, ...]:
    if isinstance(value, str):
        try:
            out = parse_ranges(value)
        except ValueError as err:
            raise FileRuleBroken(path, str(err)) from None
    elif isinstance(value, int):
        out = (value,)
    else:
        out = tuple(sorted(set(value)))
    if limit is not None and out and out[-1] >= limit:
        raise FileRuleBroken(path, f"index {out[-1]} out of range: there are {limit} GPUs")
    return out


def _pairs_of(members: tuple[int, ...]) -> list[tuple[int, int]]:
    return [(a, b) for i, a in enumerate(members) for b in members[i + 1:]]


def _pair(key: str, path: str, count: int) -> tuple[int, int]:
    m = _PAIR_RE.match(key)
    if not m:
        raise FileRuleBroken(path, 'expected a GPU pair like "0-1"')
    a, b = int(m.group(1)), int(m.group(2))
    if a == b or max(a, b) >= count:
        raise FileRuleBroken(path, f"not a pair of two distinct GPUs below {count}")
    return (min(a, b), max(a, b))


def _level(label: str, path: str) -> PcieLevel:
    """Either spelling, nvidia-smi's (PIX) or NVML's (SINGLE), as PcieLevel reads them."""
    try:
        return PcieLevel.from_label(label)
    except ValueError as err:
        raise FileRuleBroken(path, str(err)) from None


def _cuda_version(value: str | int | None) -> int | None:
    if isinstance(value, str):
        major, minor = value.strip().split(".")
        return int(major) * 1000 + int(minor) * 10
    return value


def _capability(value: str | tuple[int, int] | None) -> tuple[int, int] | None:
    if value is None:
        return None
    major, minor = value.strip().split(".") if isinstance(value, str) else value
    return (int(major), int(minor))


def _check_unique_uuids(gpus: tuple[GpuSpec, ...]) -> None:
    seen: dict[str, int] = {}
    for g in gpus:
        for u in (g.uuid, *(m.uuid for m in g.mig)):
            if u in seen:
                raise FileRuleBroken(f"gpus[{g.index}].uuid", f"{u} is also used by GPU {seen[u]}")
            seen[u] = g.index


def _gpu(index: int, fields: dict[str, tuple[Any, str]], machine: str, bus_ids: list[str],
         numa: int | None, cpus: tuple[int, ...] | None, switch_ports: list[PortSpec],
         direct: dict[tuple[int, int], int]) -> GpuSpec:
    def get(key: str, default: Any = None) -> Any:
        return fields[key][0] if key in fields else default

    for key in ("name", "memory_mib"):
        if key not in fields:
            raise FileRuleBroken(f"gpus[{index}].{key}", f"missing (set it in [gpu_defaults] or [gpus.{index}])")
    memory: int = get("memory_mib")
    affinity = cpus if "cpu_affinity" not in fields else _indices(*fields["cpu_affinity"])
    mig_path = fields["mig"][1] if "mig" in fields else f"gpus[{index}].mig"
    mig = _migs(get("mig", []), mig_path, index=index, machine=machine, memory=memory)
    capable: bool = get("mig_capable", bool(mig))
    if mig and not capable:
        raise FileRuleBroken(fields["mig_capable"][1], "MIG instances are listed but mig_capable is false")
    ports = list(switch_ports)
    peers = sorted((b if a == index else a, n) for (a, b), n in direct.items() if index in (a, b))
    for peer, n in peers:
        ports.extend([PortSpec(bus_ids[peer], False)] * n)
    n_ports: int = get("nvlink_ports", len(ports))
    if n_ports < len(ports):
        raise FileRuleBroken(fields["nvlink_ports"][1],
                             f"GPU {index} uses {len(ports)} NVLinks but has {n_ports} ports")
    return GpuSpec(
        index=index, uuid=get("uuid") or _make_uuid("GPU", machine, index), name=get("name"),
        memory_mib=memory, pci_bus_id=bus_ids[index],
        compute_capability=_capability(get("compute_capability")), multiprocessors=get("multiprocessors"),
        numa_node=numa, cpu_affinity=affinity or None, mig_capable=capable, mig=mig,
        ports=tuple(ports) + (None,) * (n_ports - len(ports)),
        temperature_c=get("temperature_c", 35), unsupported=frozenset(get("unsupported", [])),
    )


def _migs(entries: list[MigEntry], path: str, *, index: int, machine: str, memory: int) -> tuple[MigSpec, ...]:
    """Instance ids unique, at most 8 instances, and no more memory than the GPU has."""
    out: list[MigSpec] = []
    next_free = 1
    for k, entry in enumerate(entries):
        first = next_free if entry.gpu_instance_id is None else entry.gpu_instance_id
        slices_match = re.match(r"^(\d+)g\.", entry.profile)
        slices = entry.slices if entry.slices is not None else (
            int(slices_match.group(1)) if slices_match else None)
        for gi in range(first, first + entry.count):
            if any(m.gpu_instance_id == gi for m in out):
                raise FileRuleBroken(f"{path}[{k}].gpu_instance_id", f"GPU instance {gi} is listed twice")
            out.append(MigSpec(
                profile=entry.profile, memory_mib=entry.memory_mib, gpu_instance_id=gi,
                compute_instance_id=entry.compute_instance_id,
                uuid=_make_uuid("MIG", machine, index, len(out)),
                slices=slices, multiprocessors=entry.multiprocessors,
            ))
        next_free = max(m.gpu_instance_id for m in out) + 1
    if len(out) > 8:
        raise FileRuleBroken(path, f"{len(out)} MIG instances; a GPU has at most 8")
    if sum(m.memory_mib for m in out) > memory:
        raise FileRuleBroken(path, f"MIG instances need more than the GPU's {memory} MiB")
    return tuple(out)


def _make_uuid(kind: str, machine: str, *parts: int) -> str:
    """Stable across runs so state files written on a simulated box stay valid."""
    key = ":".join(["computegroups", machine, *map(str, parts)])
    return f"{kind}-{uuid.uuid5(uuid.NAMESPACE_URL, key)}"


