"""What loading a machine file gives: every fact the fake NVML reports, nothing left to infer.

`MachineFile.expand` (machinefile_model.py) produces these from the compact
file; `fakenvml.FakeNvml` answers from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from computegroups.topology.model import PcieLevel

MAX_GPUS = 1024


class MachineFileError(ValueError):
    """A machine file that cannot be loaded; the message names file and field."""


# -- what loading gives: nothing left to infer --------------------------------
@dataclass(frozen=True)
class MigSpec:
    profile: str
    memory_mib: int
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str
    slices: int | None = None
    multiprocessors: int | None = None


@dataclass(frozen=True)
class PortSpec:
    """One active NVLink port as the GPU reports it: who is at the other end."""

    remote_bus_id: str
    remote_is_switch: bool


@dataclass(frozen=True)
class GpuSpec:
    index: int
    uuid: str
    name: str
    memory_mib: int
    pci_bus_id: str
    compute_capability: tuple[int, int] | None
    multiprocessors: int | None
    numa_node: int | None
    cpu_affinity: tuple[int, ...] | None
    mig_capable: bool
    mig: tuple[MigSpec, ...]
    ports: tuple[PortSpec | None, ...]
    temperature_c: int
    unsupported: frozenset[str]


@dataclass(frozen=True)
class MachineSpec:
    """A machine file after expansion: nothing left to infer."""

    name: str
    label: str
    hostname: str
    driver_version: str | None
    cuda_driver_version: int | None
    gpus: tuple[GpuSpec, ...]
    pcie: Mapping[tuple[int, int], PcieLevel]
    switch_bus_ids: tuple[str, ...]
    worker_memory_mib: int | None = None
    """`[simulate]`: what each running worker uses on each of its GPUs (None: workers are not listed)."""
    worker_utilization_pct: int | None = None

    def pcie_level(self, a: int, b: int) -> PcieLevel:
        if a == b:
            return PcieLevel.INTERNAL
        return self.pcie[(min(a, b), max(a, b))]

