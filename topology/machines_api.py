"""Choosing and opening a machine: real NVML or a simulated one.

`load_machine` is what most callers want; `open_gateway` is for those that
keep talking to NVML afterwards (the daemon's health loop). A simulated
machine is chosen by name or machine-file path, explicitly or through
`$CG_SIMULATE`; without one the real driver is used.
"""

from __future__ import annotations

import os

from computegroups.topology.discovery import discover
from computegroups.topology.fakenvml import FakeNvml
from computegroups.topology.machinefile import load_machine_spec
from computegroups.topology.model import Machine
from computegroups.topology.nvml import NvmlGateway

SIMULATE_ENV = "CG_SIMULATE"


def open_gateway(simulate: str | None = None, worker_mark: tuple[str, str] | None = None) -> NvmlGateway:
    """A started gateway to the real NVML, or to the fake for a simulated machine.

    `simulate` is a shipped machine name or a machine file path; None falls
    back to `$CG_SIMULATE`, then the real driver. Raises MachineFileError for
    a bad name or file and NvmlUnavailable (with a hint to simulate) when
    there is no driver, here rather than at first use, so a caller can fall
    back to a simulated machine at once. `worker_mark` (an environment
    variable and its value) names the processes a simulated machine lists on
    the GPUs their CUDA_VISIBLE_DEVICES names (see `FakeNvml`); the real
    driver knows its processes without it.
    """
    chosen = simulate or os.environ.get(SIMULATE_ENV) or None
    if chosen is None:
        gateway = NvmlGateway()
    else:
        gateway = simulated_gateway(FakeNvml(load_machine_spec(chosen), worker_mark=worker_mark))
    gateway.start()
    return gateway


def simulated_gateway(fake: FakeNvml) -> NvmlGateway:
    """A gateway on a fake (tests build fakes with failure hooks); never reads
    this host's sysfs, whose devices are not the simulated ones."""
    return NvmlGateway(fake, source=f"simulated:{fake.simulated_name}",
                       hostname=fake.hostname, sysfs_root=None)


def load_machine(simulate: str | None = None) -> Machine:
    """Discover the machine once and let go of NVML."""
    with open_gateway(simulate) as gateway:
        return discover(gateway)
