"""`cgctl topo`: the GPUs and how they are wired.

It shows the machine the running cgd serves (`GET /v1/machine`), so on a box
without GPUs and a cgd on a simulated machine it shows that machine. With no
cgd answering (or `--local`, or `--simulate`), it reads NVML or the simulated
machine itself, so it works before cgd is installed, which is when people
most want to see their box. The matrix follows `nvidia-smi topo -m` so it
reads the way they know.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import click

from computegroups.cli.connect import fail
from computegroups.cli.context import CliContext
from computegroups.topology.ranges import format_ranges

if TYPE_CHECKING:  # loaded by the command when it runs, not by `cgctl --help`
    from computegroups.topology.model import Machine

LEGEND = (
    "  X    = Self",
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes",
    ("  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges"
     " within a NUMA node"),
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
    "  PIX  = Connection traversing at most a single PCIe bridge",
    "  NV#  = Connection traversing a bonded set of # NVLinks",
)


@click.command()
@click.option("--local", is_flag=True, help="Read NVML here even when a cgd answers on the socket.")
@click.pass_obj
def topo(obj: CliContext, local: bool) -> None:
    """Show GPUs, NVLink/PCIe links, NVLink islands and NUMA affinity."""
    from computegroups.topology import MachineFileError, NvmlUnavailable, load_machine
    from computegroups.topology.serialize import machine_to_dict

    machine = None
    if not (local or obj.simulate or os.environ.get("CG_SIMULATE")):
        machine = _served(obj.socket)
    if machine is None:
        try:
            machine = load_machine(obj.simulate)
        except (NvmlUnavailable, MachineFileError) as err:
            fail(str(err))
    if obj.json:
        click.echo(json.dumps(machine_to_dict(machine), indent=2))
    else:
        click.echo("\n".join(topo_text(machine)))


def _served(socket: str | None) -> Machine | None:
    """The machine the cgd on `socket` serves; None when no cgd answers there."""
    from computegroups.daemon.client.errors import CgdError, CgdUnreachable
    from computegroups.daemon.client.sync import CgdClient
    from computegroups.topology.serialize import machine_from_dict

    try:
        return machine_from_dict(CgdClient(socket, timeout=5).machine())
    except CgdUnreachable:
        return None
    except CgdError as err:
        fail(str(err))


def topo_text(machine: Machine) -> list[str]:
    versions = [f"driver {machine.driver_version or 'unknown'}",
                f"CUDA {machine.cuda_driver_version or 'unknown'}"]
    lines = [f"{machine.hostname} ({machine.source}), {', '.join(versions)}"]
    if not machine.gpus:
        lines.append("No GPUs.")
        lines.extend(_lost(machine))
        return lines
    lines.append("")
    lines.extend(_gpu_table(machine))
    lines.append("")
    lines.extend(_matrix(machine))
    lines.append("")
    lines.append("Legend:")
    lines.extend(LEGEND)
    lines.append("")
    islands = " ".join("{" + format_ranges(i) + "}" for i in machine.nvlink_islands)
    lines.append(f"NVLink islands: {islands}")
    switched = format_ranges(g.index for g in machine.gpus if g.nvswitch_links)
    lines.append(f"NVSwitch: {'yes, GPUs ' + switched if machine.has_nvswitch else 'no'}")
    lines.append("NUMA nodes: " + _numa_summary(machine))
    lines.extend(_lost(machine))
    return lines


def _gpu_table(machine: Machine) -> list[str]:
    header = ("GPU", "NAME", "MEMORY", "NUMA", "PCI BUS ID", "CC", "SMs")
    rows = []
    for g in machine.gpus:
        cc = f"{g.compute_capability[0]}.{g.compute_capability[1]}" if g.compute_capability else "-"
        rows.append((str(g.index), g.name, _mib(g.memory_mib), _or_dash(g.numa_node),
                     g.pci_bus_id, cc, _or_dash(g.multiprocessors)))
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)).rstrip()

    lines = [line(header)]
    for row, g in zip(rows, machine.gpus, strict=True):
        lines.append(line(row))
        for m in g.mig_devices:
            ids = f"GI {_or_dash(m.gpu_instance_id)} CI {_or_dash(m.compute_instance_id)}"
            lines.append(f"  MIG {m.index}: {m.profile}  {_mib(m.memory_mib)}  {ids}  {m.uuid}")
        if g.mig_enabled and not g.mig_devices:
            lines.append("  MIG enabled, no instances")
    return lines


def _matrix(machine: Machine) -> list[str]:
    heads = [f"GPU{g.index}" for g in machine.gpus]
    width = max(len(h) for h in heads) + 2  # labels are at most 4 wide (NODE, NV18)
    lines = [" " * width + "".join(h.ljust(width) for h in heads) + "CPU Affinity    NUMA Affinity"]
    for g, row in zip(machine.gpus, machine.link_matrix, strict=True):
        cells = "".join(("X" if link is None else link.label).ljust(width) for link in row)
        cpus = format_ranges(g.cpu_affinity) if g.cpu_affinity else "N/A"
        lines.append(f"GPU{g.index}".ljust(width) + cells + cpus.ljust(16) + _or_dash(g.numa_node, "N/A"))
    return [line.rstrip() for line in lines]


def _numa_summary(machine: Machine) -> str:
    parts = []
    for node, gpus in sorted(machine.gpus_by_numa.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        cpus: set[int] = set()
        for index in gpus:
            cpus.update(machine.gpu(index).cpu_affinity or ())
        label = "unknown" if node is None else str(node)
        cpu_text = f", CPUs {format_ranges(cpus)}" if cpus else ""
        parts.append(f"{label}: GPUs {format_ranges(gpus)}{cpu_text}")
    return "; ".join(parts)


def _lost(machine: Machine) -> list[str]:
    return [f"Lost GPU {g.index}: {g.reason}" + (f" ({g.uuid})" if g.uuid else "")
            for g in machine.lost_gpus]


def _mib(value: int | None) -> str:
    return f"{value} MiB" if value is not None else "unknown"


def _or_dash(value: object, dash: str = "-") -> str:
    return dash if value is None else str(value)
