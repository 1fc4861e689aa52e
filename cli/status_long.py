"""`cgctl status --long`: one block per GPU, the layout from before the one-line view.

Drawn from the same `Board` as `cgctl status` (status_view), so the two say the
same thing: who is on a GPU and in which state (a group made on its own that no
component uses among them), its marks, its measured utilisation and
temperature (`?` once stale). The block adds what one line has no room for:
bars of the memory and SMs cgd handed out, the MIG instances, each reason in
full; and, under the GPUs, every group made on its own (`cgctl group create`)
with who uses it, since such a group may hold a GPU no component is on yet,
be shared by several, or hold CPUs only.

Every line fits `width`: the bars narrow, the model loses its vendor, lists
wrap under their label, and a value too long for a line keeps its start and
its end around `...` (ids) or its start (MIG UUIDs), never cut without a mark.
"""

from __future__ import annotations

from collections.abc import Sequence

from computegroups.cli.render import (
    BAR_WIDTH,
    Doc,
    Style,
    bar,
    cpus_label,
    devices_label,
    fitted_table,
    glance_lines,
    level,
    shorten,
    size,
    state_loss_lines,
)
from computegroups.cli.status_view import (
    Board,
    clip,
    cpu_only,
    gpu_cells,
    mark_colour,
    marks,
    occupant_label,
    reasons,
    short_model,
    state_colour,
)
from computegroups.cli.terminal import WIDTH

Word = tuple[str, str]
"""A word as it takes room (plain) and as it shows (styled)."""
NARROWEST_BAR = 8
"""Fewer cells than this tell nothing: the bar goes and its numbers stay."""
MIG_STEPS = (("shrink", 1, 15), ("shrink", 2, 12), ("shrink", 2, 6), ("shrink", 1, 8))
"""A MIG line gives up the UUID's tail first (`MIG-1a2b3c4d...` tells instances apart), then the group's middle."""
GROUP_STEPS = (("shrink", 3, 16), ("shrink", 0, 16), ("drop", 1, 0), ("shrink", 2, 12), ("shrink", 3, 8),
               ("shrink", 0, 10), ("shrink", 2, 8))
"""Groups made on their own: who uses them narrows first, then long ids; the state goes before the devices."""


def long_lines(board: Board, style: Style, width: int = WIDTH) -> list[str]:
    """The state loss warning if any, a count of the GPUs, a block per GPU, the lost groups, the
    groups made on their own, the components on CPUs alone, then the components worth a look;
    nothing wider than `width`."""
    gpus = board.gpus
    busy = sum(1 for g in gpus if g.get("groups"))
    drained = sum(1 for g in gpus if g.get("drained"))
    unhealthy = sum(1 for g in gpus if g.get("health") not in (None, "ok") or g.get("degraded"))
    lines = [*state_loss_lines(board.status.get("state_loss") or [], style),
             f"{len(gpus)} GPUs: {busy} in use, {drained} drained, {unhealthy} unhealthy"]
    short = any(len(_head(board, g, style, width, short=False)) > 1 for g in gpus)  # one name for GPUs alike
    for g in gpus:
        lines += ["", *gpu_block(board, g, style, width, short)]
    lost = board.status.get("lost_groups") or []
    if lost:
        rows = [[str(grp["id"]), str(grp.get("owner")), devices_label(grp.get("devices") or [])] for grp in lost]
        lines += ["", style("LOST", fg="red", bold=True) + " groups whose devices vanished:",
                  *_rows(rows, width, (("shrink", 0, 16), ("shrink", 1, 10), ("shrink", 2, 8)))]
    lines += own_group_lines(board, width)
    lines += cpu_only_lines(board, style, width)
    glance = glance_lines(board.status.get("components") or [], width)
    if glance:
        lines += ["", *glance]
    return [clip(text, width) for text in lines]


def gpu_block(board: Board, g: Doc, style: Style, width: int, short: bool = False) -> list[str]:
    """One GPU as a person reads it: marks, measured utilisation and temperature, memory and SM
    bars of what cgd handed out, MIG instances, who is on it, and why it is marked; with `short`,
    the model without its vendor and form factor."""
    return [*_head(board, g, style, width, short), *_bars(g, style, width), *_mig(g, width),
            *_on_it(board, g, style, width),
            *flow([(w, w) for w in "; ".join(reasons(g)).split()], width, "  why: ", "       ")]


def _head(board: Board, g: Doc, style: Style, width: int, short: bool) -> list[str]:
    """`GPU 3  NVIDIA H100 80GB HBM3  util 87%  61C  FAILED  DEGRADED`; with `short`, `H100 80GB`.
    What does not fit goes on under it."""
    cells = gpu_cells(g, [], board.stale(g))
    found = marks(g)
    tail: list[Word] = [(f"util {cells.util}", f"util {cells.util}"), (cells.temperature, cells.temperature),
                        *((m, style(m, fg=mark_colour(m), bold=True)) for m in found)]
    if not found:
        tail.append(("ok", style("ok", fg="green")))
    first = f"GPU {g['index']}"
    name = short_model(g.get("name")) if short else str(g.get("name") or "-")
    return flow([(first, style(first, bold=True)), (name, name), *tail], width, "", "  ", gap="  ")


def _bars(g: Doc, style: Style, width: int) -> list[str]:
    """`mem [####++----] 60.0/80.0 GiB (20.0 GiB foreign)` and `sm  [###-------] 30%`, the bars as
    wide as both lines leave room for (at most `BAR_WIDTH` cells, none on a narrow terminal)."""
    total = g.get("memory_mib") or 0
    ours, foreign = g.get("memory_allocated_mib") or 0, g.get("memory_foreign_mib") or 0
    used = ours + foreign
    extra = f" ({size(foreign)} foreign)" if foreign else ""
    memory = f"{used / 1024:.1f}/{total / 1024:.1f} GiB{extra}"
    widest = f"{total / 1024:.1f}/{total / 1024:.1f} GiB{extra}"  # the same bar on GPUs alike, however full
    pct = g.get("compute_allocated_pct")
    compute = "(MIG: shared by instance)" if pct is None else f"{pct}%"
    cells = min(BAR_WIDTH, width - len("  mem [] ") - max(len(memory), len(widest)),
                width - len("  sm  [] ") - len(compute) if pct is not None else BAR_WIDTH)
    if cells < NARROWEST_BAR:
        return [f"  mem {memory}", f"  sm  {compute}"]
    mem_bar = bar([(ours, "#"), (foreign, "+")], total, style, level(used / total if total else 0), cells)
    sm = compute if pct is None else f"{bar([(pct, '#')], 100, style, level(pct / 100), cells)} {compute}"
    return [f"  mem {mem_bar} {memory}", f"  sm  {sm}"]


def _mig(g: Doc, width: int) -> list[str]:
    """`mig 1g.10gb  MIG-1a2b3c4d-...  group.5`: each instance, its UUID (in full when it fits) and
    the group on it, or `free`."""
    rows = [[str(m.get("profile")), str(m.get("uuid")), str(m.get("group") or "free")]
            for m in g.get("mig_devices") or []]
    return [f"  mig {line.strip()}" for line in _rows(rows, width - 4, MIG_STEPS, middle=(2,))]


def _on_it(board: Board, g: Doc, style: Style, width: int) -> list[str]:
    """Who is on the GPU as its line in `cgctl status` names them (`web:run`, `group.5:group`), the
    exclusive owner marked; as many lines as they need."""
    users = board.shared
    words: list[list[Word]] = []
    for o in board.on(g):
        text = occupant_label(o, users)
        words.append([(text, style(text, fg=state_colour(o.state)))])
        if o.name == g.get("exclusive_owner"):
            words[-1].append(("(exclusive)", "(exclusive)"))
    return flow([w for each in _ended(words, ",") for w in each], width, "  on it: ", "         ")


def own_group_lines(board: Board, width: int) -> list[str]:
    """The groups made on their own, which `cgctl group create` places and components use by id:
    their state, devices (or CPUs) and who uses them (`-`: nobody yet)."""
    if not board.own_groups:
        return []
    rows = []
    for grp in board.own_groups.values():
        devices = grp.get("devices") or []
        held = devices_label(devices) if devices else cpus_label(grp.get("claim") or {})
        rows.append([str(grp["id"]), str(grp.get("state") or "-"), held, ", ".join(grp.get("users") or []) or "-"])
    title = ["groups", "made", "on", "their", "own", "(`cgctl group create`):"]
    return ["", *flow([(w, w) for w in title], width, "", "  "),
            *_rows(rows, width, GROUP_STEPS, middle=(0,), header=["GROUP", "STATE", "DEVICES", "USED BY"])]


def cpu_only_lines(board: Board, style: Style, width: int) -> list[str]:
    """The components that hold CPUs and no GPU (no GPU block names them): `prep:run (4 CPUs),`."""
    users = board.shared
    words: list[list[Word]] = []
    for o, n in cpu_only(board):
        label, cpus = occupant_label(o, users), f"({n} CPU{'s' if n != 1 else ''})"
        words.append([(label, style(label, fg=state_colour(o.state))), (cpus, cpus)])
    if not words:
        return []
    return ["", *flow([w for each in _ended(words, ",") for w in each], width, "CPU only: ", "          ")]


def _rows(rows: Sequence[Sequence[str]], width: int, steps: Sequence[tuple[str, int, int]],
          middle: Sequence[int] = (0,), header: Sequence[str] | None = None) -> list[str]:
    """A table indented by two under its title, fitted to `width` (see `fitted_table`); without
    `header`, its rows alone."""
    if not rows:
        return []
    lines = fitted_table(header or [""] * len(rows[0]), rows, width - 2, steps, middle=middle)
    return ["  " + line for line in (lines if header else lines[1:])]


def _ended(items: Sequence[Sequence[Word]], mark: str) -> list[list[Word]]:
    """Each item of a list but the last ending in `mark` (`,`), the way a list reads on one line or wrapped."""
    return [[*words[:-1], (words[-1][0] + mark, words[-1][1] + mark)] if n < len(items) - 1 else list(words)
            for n, words in enumerate(items)]


def flow(words: Sequence[Word], width: int, first: str, indent: str, gap: str = " ") -> list[str]:
    """`words` on as many lines as they need within `width`: the first line after `first`, the
    others after `indent`. A word wider than a line of its own keeps its start and its end
    (and loses its colour). No words: no line."""
    if not words:
        return []
    lines: list[str] = []
    text, used, empty = first, len(first), True
    for plain, styled in words:
        if not empty and used + len(gap) + len(plain) > width:
            lines.append(text)
            text, used, empty = indent, len(indent), True
        if empty and used + len(plain) > width:
            plain = styled = shorten(plain, max(1, width - used), middle=True)
        text += ("" if empty else gap) + styled
        used += len(plain) + (0 if empty else len(gap))
        empty = False
    return [*lines, text]
