"""`cgctl topo`: the GPUs and how they are wired.

It shows the machine the running cgd serves (`GET /v1/machine`), so on a box
without GPUs and a cgd on a simulated machine it shows that machine. With no
cgd answering (or `--local`, or `--simulate`), it reads NVML or the simulated
machine itself, so it works before cgd is installed, which is when people
most want to see their box. The matrix follows `nvidia-smi topo -m` so it
reads the way they know; a box whose matrix is wider than the terminal gets
a line per NVLink island instead (the links inside it, the nearest GPUs
outside it), and `--matrix` the matrix in blocks of the columns that fit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from computegroups.cli.connect import fail
from computegroups.cli.context import CliContext
from computegroups.cli.render import Step, fitted_table, shorten, wrap
from computegroups.cli.status_view import short_model
from computegroups.cli.terminal import columns
from computegroups.topology.ranges import format_ranges

if TYPE_CHECKING:  # loaded by the command when it runs, not by `cgctl --help`
    from computegroups.topology.model import Gpu, Machine

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
GPU_STEPS: tuple[Step, ...] = (("shrink", 1, 16), ("drop", 6, 0), ("drop", 5, 0), ("drop", 4, 0), ("shrink", 1, 9))
"""How the GPU table fits a narrow terminal: the name narrows, then SMs, CC and the PCI bus id go."""
ISLAND_STEPS: tuple[Step, ...] = (("shrink", 5, 12), ("shrink", 3, 10), ("shrink", 2, 9), ("drop", 5, 0))


@click.command()
@click.option("--local", is_flag=True, help="Read NVML here even when a cgd answers on the socket.")
@click.option("--matrix", is_flag=True,
              help="The GPU x GPU link matrix even when it is wider than the terminal (in blocks of the "
                   "GPU columns that fit), rather than a line per NVLink island.")
@click.pass_obj
def topo(obj: CliContext, local: bool, matrix: bool) -> None:
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
        click.echo("\n".join(topo_text(machine, columns(), matrix)))


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


def topo_text(machine: Machine, width: int = 80, matrix: bool = False) -> list[str]:
    """The machine within `width` columns: its GPUs, the link matrix (or, when the matrix is wider
    and `matrix` was not asked for, a line per NVLink island), the legend, islands and NUMA nodes."""
    versions = [f"driver {machine.driver_version or 'unknown'}",
                f"CUDA {machine.cuda_driver_version or 'unknown'}"]
    lines = wrap(f"{machine.hostname} ({machine.source}), {', '.join(versions)}", width)
    if not machine.gpus:
        lines.append("No GPUs.")
        lines.extend(_lost(machine, width))
        return lines
    lines.append("")
    lines.extend(_gpu_table(machine, width))
    lines.append("")
    whole = _matrix(machine)
    short = _matrix(machine, affinity=(AFFINITY[0], "NUMA"))  # where only the head is too wide
    if max(map(len, whole)) <= width:
        lines.extend(whole)
    elif max(map(len, short)) <= width:
        lines.extend(short)
    elif matrix:
        lines.extend(_matrix_blocks(machine, width))
    else:
        lines.extend(_island_table(machine, width))
        lines.append("")
        lines.extend(wrap(f"The link matrix of {len(machine.gpus)} GPUs takes {max(map(len, whole))} columns; "
                          "`cgctl topo --matrix` shows it in blocks that fit.", width))
    lines.append("")
    lines.append("Legend:")
    lines.extend(line for text in LEGEND for line in wrap(text, width, indent=" " * 9))
    lines.append("")
    islands = " ".join("{" + format_ranges(i) + "}" for i in machine.nvlink_islands)
    lines.extend(wrap(f"NVLink islands: {islands}", width))
    lines.extend(wrap(f"NVSwitch: {_fabrics(machine)}", width))
    lines.extend(wrap("NUMA nodes: " + _numa_summary(machine), width))
    lines.extend(_lost(machine, width))
    return lines


def _fabrics(machine: Machine) -> str:
    """`2 fabrics, GPUs 0-7 and 8-15`: each NVSwitch fabric by its GPUs (in braces when one is
    not a single range, so its commas do not read as the list's), or `no`."""
    names = [format_ranges(f) for f in machine.nvswitch_fabrics]
    if not names:
        return "no"
    if any("," in name for name in names):
        names = ["{" + name + "}" for name in names]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"{len(names)} fabric{'s' if len(names) > 1 else ''}, GPUs {listed}"


def _gpu_table(machine: Machine, width: int) -> list[str]:
    header = ("GPU", "NAME", "MEMORY", "NUMA", "PCI BUS ID", "CC", "SMs")
    rows: list[tuple[str, ...]] = []
    mig: dict[int, list[str]] = {}
    for g in machine.gpus:
        cc = f"{g.compute_capability[0]}.{g.compute_capability[1]}" if g.compute_capability else "-"
        rows.append((str(g.index), g.name, _mib(g.memory_mib), _or_dash(g.numa_node),
                     g.pci_bus_id, cc, _or_dash(g.multiprocessors)))
        mig[g.index] = [f"  MIG {m.index}: {m.profile}  {_mib(m.memory_mib)}  GI {_or_dash(m.gpu_instance_id)} "
                        f"CI {_or_dash(m.compute_instance_id)}  {m.uuid}" for m in g.mig_devices]
        if g.mig_enabled and not g.mig_devices:
            mig[g.index].append("  MIG enabled, no instances")
    table = fitted_table(header, rows, width, GPU_STEPS, middle=(1,))
    lines = [table[0]]
    for line, g in zip(table[1:], machine.gpus, strict=True):
        lines.append(line)
        lines.extend(shorten(text, width) for text in mig[g.index])
    return lines


AFFINITY = ("CPU Affinity", "NUMA Affinity")


def _matrix(machine: Machine, gpus: Sequence[Gpu] | None = None, affinity: tuple[str, ...] = AFFINITY
            ) -> list[str]:
    """`nvidia-smi topo -m`: a row per GPU, a column per GPU of `gpus` (all of them by default),
    then the CPU and NUMA affinity (heads `affinity`, none when empty)."""
    columns_of = machine.gpus if gpus is None else gpus
    heads = [f"GPU{g.index}" for g in machine.gpus]
    width = max(len(h) for h in heads) + 2  # labels are at most 4 wide (NODE, NV18)
    cpu_width = max(16, *(len(format_ranges(g.cpu_affinity)) + 2 for g in machine.gpus if g.cpu_affinity))
    head_cells = "".join(f"GPU{h.index}".ljust(width) for h in columns_of)
    tail = (affinity[0].ljust(cpu_width) + affinity[1]) if affinity else ""
    lines = [" " * width + head_cells + tail]
    for g in machine.gpus:
        cells = "".join(("X" if g.index == h.index else machine.link(g.index, h.index).label).ljust(width)
                        for h in columns_of)
        cpus = format_ranges(g.cpu_affinity) if g.cpu_affinity else "N/A"
        tail = (cpus.ljust(cpu_width) + _or_dash(g.numa_node, "N/A")) if affinity else ""
        lines.append(f"GPU{g.index}".ljust(width) + cells + tail)
    return [line.rstrip() for line in lines]


def _matrix_blocks(machine: Machine, width: int) -> list[str]:
    """The matrix cut into blocks of as many GPU columns as fit `width`, one under the other; the
    affinities after the last block (or as a block of their own when they do not fit beside it)."""
    cell = max(len(f"GPU{g.index}") for g in machine.gpus) + 2
    per_block = max(1, (width - cell) // cell)
    gpus = list(machine.gpus)
    blocks = [gpus[at:at + per_block] for at in range(0, len(gpus), per_block)]
    lines: list[str] = []
    for n, block in enumerate(blocks):
        last = n == len(blocks) - 1
        with_affinity = _matrix(machine, block) if last else []
        if with_affinity and max(map(len, with_affinity)) <= width:
            part = with_affinity
        else:
            part = _matrix(machine, block, ())
            if last:
                part += ["", *_affinity(machine)]
        lines += ([""] if lines else []) + [shorten(text, width) for text in part]
    return lines


def _affinity(machine: Machine) -> list[str]:
    rows = [(f"GPU{g.index}", format_ranges(g.cpu_affinity) if g.cpu_affinity else "N/A",
             _or_dash(g.numa_node, "N/A")) for g in machine.gpus]
    width = max(len(r[0]) for r in rows) + 2
    cpu_width = max(16, *(len(r[1]) + 2 for r in rows))
    return [(" " * width + AFFINITY[0].ljust(cpu_width) + AFFINITY[1]).rstrip(),
            *(r[0].ljust(width) + r[1].ljust(cpu_width) + r[2] for r in rows)]


def _island_table(machine: Machine, width: int) -> list[str]:
    """A line per NVLink island: its GPUs, their model, the NVLinks inside it (fewest-most lanes,
    and how many of its pairs have one), its NUMA nodes, and the GPUs outside it that are nearest
    over PCIe."""
    rows = []
    for island in machine.nvlink_islands:
        members = sorted(island)
        models = {short_model(machine.gpu(i).name) for i in members}
        pairs = [machine.link(a, b) for n, a in enumerate(members) for b in members[n + 1:]]
        lanes = sorted({link.nvlinks for link in pairs if link.nvlinks})
        linked = sum(1 for link in pairs if link.nvlinks)
        nvlink = "-" if not lanes else f"NV{lanes[0]}" + (f"-NV{lanes[-1]}" if len(lanes) > 1 else "")
        if lanes:
            nvlink += ", all pairs" if linked == len(pairs) else f", {linked} of {len(pairs)} pairs"
        numa = sorted({node for i in members if (node := machine.gpu(i).numa_node) is not None})
        rows.append((format_ranges(members), str(len(members)), models.pop() if len(models) == 1 else "mixed",
                     nvlink, format_ranges(numa) or "-", _nearest(machine, island)))
    return fitted_table(("ISLAND", "GPUS", "MODEL", "NVLINK", "NUMA", "NEAREST OUTSIDE"), rows, width,
                        ISLAND_STEPS)


def _nearest(machine: Machine, island: frozenset[int]) -> str:
    """`PIX 65-67`: the closest PCIe relation from the island to a GPU outside it, and those GPUs."""
    from computegroups.topology.model import PcieLevel

    best: dict[int, set[int]] = {}
    for a in island:
        for g in machine.gpus:
            if g.index not in island and (pcie := machine.link(a, g.index).pcie) is not None:
                best.setdefault(int(pcie), set()).add(g.index)
    if not best:
        return "-"
    level = min(best)
    return f"{PcieLevel(level).label} {format_ranges(best[level])}"


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


def _lost(machine: Machine, width: int) -> list[str]:
    return [line for g in machine.lost_gpus
            for line in wrap(f"Lost GPU {g.index}: {g.reason}" + (f" ({g.uuid})" if g.uuid else ""), width)]


def _mib(value: int | None) -> str:
    return f"{value} MiB" if value is not None else "unknown"


def _or_dash(value: object, dash: str = "-") -> str:
    return dash if value is None else str(value)
