"""NVML -> `Machine`: the one discovery, for real boxes and simulated ones.

Rules that keep one bad GPU or one old driver from sinking discovery:
- a call the GPU or driver cannot answer (`computegroups.topology.nvml.UNSUPPORTED`) makes
  that field `None` and nothing else;
- any other NVML error while reading a GPU (lost, unknown, reset required)
  moves that GPU to `Machine.lost_gpus` with the reason;
- only NVML itself missing raises (`NvmlUnavailable`).

NVLink is rebuilt from what each port reports (state, remote PCI bus id,
remote device type) rather than counted per GPU pair, because on NVSwitch
boxes no port points at a peer GPU: two GPUs attached to the same switches
talk through them, min(links of the two) per switch they share.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from computegroups.topology.model import Gpu, Link, LostGpu, Machine, MigDevice, PcieLevel, components
from computegroups.topology.nvml import (
    UNSUPPORTED,
    NVMLError,
    NVMLError_GpuIsLost,
    NVMLError_NotFound,
    NVMLError_NotSupported,
    NvmlGateway,
    NvmlUnavailable,
)

_MIB = 1024 * 1024
_CPU_WORDS = 64    # 4096 CPUs in the affinity masks we ask for
_NODE_WORDS = 16   # 1024 NUMA nodes
_MIG_NAME = re.compile(r"\bMIG\s+(\S+)\s*$")

BusKey = tuple[int, int, int, int]
Port = tuple[BusKey | None, int | None]


@dataclass
class _Found:
    gpu: Gpu
    handle: Any
    ports: list[Port]


def discover(gateway: NvmlGateway) -> Machine:
    gateway.start()  # first: a missing driver is NvmlUnavailable, not a lost GPU
    driver = gateway.query("nvmlSystemGetDriverVersion")
    cuda = gateway.query("nvmlSystemGetCudaDriverVersion_v2")
    if cuda is None:
        cuda = gateway.query("nvmlSystemGetCudaDriverVersion")
    try:
        count = gateway.call("nvmlDeviceGetCount")
    except NVMLError as err:
        raise NvmlUnavailable(f"cannot count GPUs: {err}") from None

    found: list[_Found] = []
    lost: list[LostGpu] = []
    lost_buses: set[BusKey] = set()
    for index in range(count):
        result, bus = _read_gpu(gateway, index)
        if isinstance(result, LostGpu):
            lost.append(result)
            if bus is not None:
                lost_buses.add(bus)
        else:
            found.append(result)

    pcie, lost_in_pairs = _pcie_levels(gateway, found)
    for f in [f for f in found if f.gpu.index in lost_in_pairs]:
        found.remove(f)
        lost.append(LostGpu(f.gpu.index, lost_in_pairs[f.gpu.index], f.gpu.uuid))
        if (key := _bus_key(f.gpu.pci_bus_id)) is not None:
            lost_buses.add(key)

    nvlinks, switches = _nvlinks(gateway, found, lost_buses)
    switch_links = {g: sum(c.values()) for g, c in switches.items()}
    gpus = tuple(replace(f.gpu, nvswitch_links=switch_links.get(f.gpu.index, 0)) for f in found)
    links = tuple(
        Link(a.index, b.index, nvlinks.get((a.index, b.index), 0), pcie.get((a.index, b.index)))
        for a, b in itertools.combinations(gpus, 2)
    )
    return Machine(
        hostname=gateway.hostname,
        gpus=gpus,
        links=links,
        driver_version=driver,
        cuda_driver_version=_cuda_text(cuda),
        numa_nodes=tuple(sorted({g.numa_node for g in gpus if g.numa_node is not None})),
        lost_gpus=tuple(sorted(lost, key=lambda g: g.index)),
        source=gateway.source,
        cpus=machine_cpus(gpus, simulated=gateway.source != "nvml"),
        nvswitch_fabrics=components(tuple(sorted(switches)),
                                    lambda a, b: bool(switches[a].keys() & switches[b].keys())),
    )


def machine_cpus(gpus: tuple[Gpu, ...], *, simulated: bool) -> tuple[int, ...]:
    """The CPUs of the machine: those NVML says the GPUs are local to, and, on a real machine,
    every CPU this host runs on (GPUs may sit on one socket only). A simulated machine that
    lists its CPUs has those, whatever this host has; one that lists none has the host's."""
    listed = {c for g in gpus for c in g.cpu_affinity or ()}
    if listed and simulated:
        return tuple(sorted(listed))
    return tuple(sorted(listed | set(os.sched_getaffinity(0))))


def _read_gpu(gw: NvmlGateway, index: int) -> tuple[_Found | LostGpu, BusKey | None]:
    uuid: str | None = None
    bus: BusKey | None = None
    try:
        handle = gw.call("nvmlDeviceGetHandleByIndex", index)
        uuid = gw.call("nvmlDeviceGetUUID", handle)
        bus_id = gw.call("nvmlDeviceGetPciInfo", handle).busId
        bus = _bus_key(bus_id)
        memory = gw.query("nvmlDeviceGetMemoryInfo", handle)
        attributes = gw.query("nvmlDeviceGetAttributes", handle)
        capability = gw.query("nvmlDeviceGetCudaComputeCapability", handle)
        mig_enabled, mig_devices = _mig(gw, handle, index)
        gpu = Gpu(
            index=index,
            uuid=uuid,
            name=gw.query("nvmlDeviceGetName", handle, default="unknown"),
            pci_bus_id=bus_id,
            memory_mib=memory.total // _MIB if memory is not None else None,
            compute_capability=tuple(capability) if capability is not None else None,
            numa_node=_numa_node(gw, handle, bus_id),
            cpu_affinity=_bits(gw.query("nvmlDeviceGetCpuAffinity", handle, _CPU_WORDS)) or None,
            mig_enabled=mig_enabled,
            mig_devices=mig_devices,
            multiprocessors=(attributes.multiprocessorCount or None) if attributes is not None else None,
        )
        ports = _ports(gw, handle)
    except NVMLError as err:
        return LostGpu(index, str(err), uuid), bus
    return _Found(gpu, handle, ports), bus


def _numa_node(gw: NvmlGateway, handle: Any, bus_id: str) -> int | None:
    """NVML's own answer, else the GPU's memory affinity, else the kernel's."""
    node = gw.query("nvmlDeviceGetNumaNodeId", handle)
    if node is not None and node >= 0:
        return int(node)
    nodes = _bits(gw.query("nvmlDeviceGetMemoryAffinity", handle, _NODE_WORDS,
                           gw.constant("NVML_AFFINITY_SCOPE_NODE")))
    if len(nodes) == 1:
        return nodes[0]
    return gw.pci_numa_node(bus_id)


def _mig(gw: NvmlGateway, handle: Any, index: int) -> tuple[bool | None, tuple[MigDevice, ...]]:
    try:
        current, _pending = gw.call("nvmlDeviceGetMigMode", handle)
    except NVMLError_NotSupported:
        return False, ()  # NVML's word for "this GPU has no MIG": known, not unknown
    except UNSUPPORTED:
        return None, ()
    if current != gw.constant("NVML_DEVICE_MIG_ENABLE"):
        return False, ()
    devices = []
    for slot in range(gw.query("nvmlDeviceGetMaxMigDeviceCount", handle, default=0)):
        try:
            mig_handle = gw.call("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
        except (NVMLError_NotFound, *UNSUPPORTED):
            continue  # an empty slot
        device = _mig_device(gw, mig_handle, index, slot)
        if device is not None:
            devices.append(device)
    return True, tuple(devices)


def _mig_device(gw: NvmlGateway, handle: Any, parent: int, slot: int) -> MigDevice | None:
    uuid = gw.query("nvmlDeviceGetUUID", handle)
    if uuid is None:
        return None  # a device CUDA could not be pointed at is of no use
    memory = gw.query("nvmlDeviceGetMemoryInfo", handle)
    attributes = gw.query("nvmlDeviceGetAttributes", handle)
    slices = (attributes.gpuInstanceSliceCount or None) if attributes is not None else None
    profile = _mig_profile(gw.query("nvmlDeviceGetName", handle), attributes)
    if slices is None and (m := re.match(r"^(\d+)g\.", profile)):
        slices = int(m.group(1))
    return MigDevice(
        uuid=uuid,
        profile=profile,
        memory_mib=memory.total // _MIB if memory is not None else None,
        parent_index=parent,
        index=slot,
        gpu_instance_id=gw.query("nvmlDeviceGetGpuInstanceId", handle),
        compute_instance_id=gw.query("nvmlDeviceGetComputeInstanceId", handle),
        slices=slices,
    )


def _mig_profile(name: str | None, attributes: Any) -> str:
    """`3g.20gb`: NVML names MIG devices "<GPU> MIG 3g.20gb"; failing that the
    profile is rebuilt from slices and memory the way NVIDIA names them."""
    if name and (m := _MIG_NAME.search(name)):
        return m.group(1)
    if attributes is not None and attributes.gpuInstanceSliceCount and attributes.memorySizeMB:
        return f"{attributes.gpuInstanceSliceCount}g.{math.ceil(attributes.memorySizeMB / 1024)}gb"
    return "unknown"


def _ports(gw: NvmlGateway, handle: Any) -> list[Port]:
    """(remote bus, remote type) of every active NVLink port."""
    enabled = gw.constant("NVML_FEATURE_ENABLED")
    out: list[Port] = []
    for link in range(gw.constant("NVML_NVLINK_MAX_LINKS")):
        if gw.query("nvmlDeviceGetNvLinkState", handle, link) != enabled:
            continue
        pci = gw.query("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        kind = gw.query("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        out.append((_bus_key(pci.busId) if pci is not None else None, kind))
    return out


def _nvlinks(gw: NvmlGateway, found: list[_Found],
             lost_buses: set[BusKey]) -> tuple[dict[tuple[int, int], int], dict[int, Counter[BusKey | None]]]:
    """Per-pair NVLink counts, and the links of each GPU on an NVSwitch per switch.

    A remote of type GPU counts toward that pair; SWITCH puts the GPU on that
    switch; IBMNPU (a CPU) is ignored. Drivers that cannot tell the type
    (older ones) are matched by bus id: a GPU's bus is that GPU, any other
    bus a switch.
    """
    gpu_type = gw.constant("NVML_NVLINK_DEVICE_TYPE_GPU")
    switch_type = gw.constant("NVML_NVLINK_DEVICE_TYPE_SWITCH")
    npu_type = gw.constant("NVML_NVLINK_DEVICE_TYPE_IBMNPU")
    by_bus = {key: f.gpu.index for f in found if (key := _bus_key(f.gpu.pci_bus_id)) is not None}
    direct: Counter[tuple[int, int]] = Counter()
    switches: dict[int, Counter[BusKey | None]] = {}
    for f in found:
        me = f.gpu.index
        for bus, kind in f.ports:
            if kind == npu_type:
                continue
            is_gpu = kind == gpu_type or (kind != switch_type and (bus in by_bus or bus in lost_buses))
            if not is_gpu:
                switches.setdefault(me, Counter())[bus] += 1
            elif bus in by_bus and by_bus[bus] != me:
                direct[(me, by_bus[bus])] += 1
    pairs: dict[tuple[int, int], int] = {}
    for a, b in itertools.combinations(sorted(f.gpu.index for f in found), 2):
        n = max(direct[(a, b)], direct[(b, a)])
        sa, sb = switches.get(a), switches.get(b)
        if sa and sb:
            n += sum(min(sa[s], sb[s]) for s in sa.keys() & sb.keys())
        if n:
            pairs[(a, b)] = n
    return pairs, switches


def _pcie_levels(gw: NvmlGateway,
                 found: list[_Found]) -> tuple[dict[tuple[int, int], PcieLevel], dict[int, str]]:
    """Common PCIe ancestor per pair; a GPU lost meanwhile is returned with its reason."""
    levels: dict[tuple[int, int], PcieLevel] = {}
    suspects: set[int] = set()
    for a, b in itertools.combinations(found, 2):
        try:
            value = gw.query("nvmlDeviceGetTopologyCommonAncestor", a.handle, b.handle)
        except NVMLError as err:
            if isinstance(err, NVMLError_GpuIsLost):
                suspects.update((a.gpu.index, b.gpu.index))
            continue
        level = _pcie_level(value)
        if level is not None:
            levels[(a.gpu.index, b.gpu.index)] = level
    lost: dict[int, str] = {}
    for f in found:
        if f.gpu.index in suspects:
            try:
                gw.call("nvmlDeviceGetUUID", f.handle)
            except NVMLError as err:
                lost[f.gpu.index] = str(err)
    return levels, lost


def _pcie_level(value: Any) -> PcieLevel | None:
    try:
        return PcieLevel(value) if value is not None else None
    except ValueError:
        return None  # a level newer than this code knows: unknown beats wrong


def _bits(words: Any) -> tuple[int, ...]:
    """Set bits of NVML's 64-bit mask words: CPU or NUMA node ids."""
    if words is None:
        return ()
    return tuple(w * 64 + b for w, word in enumerate(words) if word for b in range(64) if int(word) >> b & 1)


def _bus_key(bus_id: str) -> BusKey | None:
    """NVML writes the domain with 4 or 8 digits depending on the call; compare numbers."""
    m = re.match(r"^\s*([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])\s*$", bus_id or "")
    if not m:
        return None
    return tuple(int(part, 16) for part in m.groups())  # type: ignore[return-value]


def _cuda_text(version: int | None) -> str | None:
    """NVML's 12040 -> "12.4", as nvidia-smi prints it."""
    if not version:
        return None
    return f"{version // 1000}.{version % 1000 // 10}"
