"""How cgctl shows cgd's documents: stable JSON projections and text.

Pure functions of the documents (no I/O), so the pictures are tested from
JSON shaped like docs/api.md without a daemon. The JSON projections are the
keys docs/cli.md promises; the text is for people and may change.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import click

from computegroups.cli.terminal import WIDTH

Json = Any
Doc = Mapping[str, Any]
Style = Callable[..., str]
BAR_WIDTH = 24
DEVICE_KEYS = ("index", "uuid", "mig_uuid", "memory_mib", "compute_pct")
REPLICA_KEYS = ("index", "group", "groups", "role", "state", "restarts", "cuda_visible_devices", "cpus",
                "cpu_binding", "pids",
                "started_at", "ended_at", "exit_code")


def colour_enabled(stream: Any = None) -> bool:
    """Colour only for a person at a terminal that shows it, who did not opt
    out (no-color.org)."""
    stream = stream if stream is not None else sys.stdout
    at_terminal = bool(getattr(stream, "isatty", lambda: False)())
    return at_terminal and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def styler(colour: bool) -> Style:
    if colour:
        return click.style
    return lambda text, **_: str(text)


def size(mib: float | None) -> str:
    if mib is None:
        return "?"
    if abs(mib) >= 1024:
        return f"{mib / 1024:.1f} GiB"
    return f"{mib:.0f} MiB"


def component_json(c: Doc) -> dict[str, Json]:
    """The projection `allocate`, `scale` and `list` print with --json."""
    return {
        "name": c["name"],
        "owner": c.get("owner"),
        "state": c.get("state"),
        "replicas_wanted": c.get("replicas_wanted"),
        "scope": c.get("scope"),
        "share_with": c.get("share_with"),
        "group": c.get("group"),
        "shadow_of": c.get("shadow_of"),
        "command": c.get("command"),
        "restart": c.get("restart"),
        "time_limit_s": c.get("time_limit_s"),
        "ended_at": c.get("ended_at"),
        "duration_s": c.get("duration_s"),
        "exit_code": c.get("exit_code"),
        "queue": c.get("queue"),
        "explanation": c.get("explanation") or None,
        "replicas": [
            {**{k: r.get(k) for k in REPLICA_KEYS},
             "devices": [{k: d.get(k) for k in DEVICE_KEYS} for d in r.get("devices") or []]}
            for r in c.get("replicas") or []
        ],
    }


def compact_size(mib: float) -> str:
    """`20GiB`, `79.6GiB`, `512MiB`: no space, for table cells."""
    if mib >= 1024:
        return f"{mib / 1024:.1f}".removesuffix(".0") + "GiB"
    return f"{mib:.0f}MiB"


def device_label(d: Doc) -> str:
    """`0` for a whole GPU, `0[20GiB/30%]` for a share, `0:MIG-1a2b3c4d` for MIG."""
    if d.get("mig_uuid"):
        return f"{d['index']}:{str(d['mig_uuid'])[:12]}"
    if d.get("whole"):
        return str(d["index"])
    parts = [compact_size(d.get("memory_mib") or 0)]
    if d.get("compute_pct") is not None:
        parts.append(f"{d['compute_pct']}%")
    return f"{d['index']}[{'/'.join(parts)}]"


def devices_label(devices: Iterable[Doc]) -> str:
    """The devices in order; a run of three or more consecutive whole GPUs as a range (`0-7`).

    >>> devices_label([{"index": i, "whole": True} for i in (0, 1, 2, 3, 5, 6)])
    '0-3,5,6'
    """
    labels: list[str] = []
    run: list[int] = []

    def flush() -> None:
        labels.extend([f"{run[0]}-{run[-1]}"] if len(run) >= 3 else [str(i) for i in run])
        run.clear()

    for d in devices:
        plain = d.get("whole") and not d.get("mig_uuid")
        if plain and run and d["index"] == run[-1] + 1:
            run.append(d["index"])
            continue
        flush()
        if plain:
            run.append(d["index"])
        else:
            labels.append(device_label(d))
    flush()
    return ",".join(labels) or "-"


def cpus_label(r: Doc) -> str:
    """What a replica without a device holds: its counted CPUs, if any."""
    return f"{r['cpus']} CPU{'s' if r['cpus'] != 1 else ''}" if r.get("cpus") else "-"


def held_label(r: Doc) -> str:
    """What a replica was given: `GPU 0,1  CUDA_VISIBLE_DEVICES=0,1`, or for a replica without a
    device its CPUs (`4 CPUs (0-3)` where cgd binds them): a CPU-only worker is told no GPU
    (CUDA_VISIBLE_DEVICES is empty), which is not worth a line of its own."""
    devices = r.get("devices") or []
    if devices:
        return f"GPU {devices_label(devices)}  CUDA_VISIBLE_DEVICES={r.get('cuda_visible_devices') or ''}"
    binding = r.get("cpu_binding")
    return cpus_label(r) + (f" ({binding})" if binding and r.get("cpus") else "")


def owner_name(c: Doc) -> str:
    owner = c.get("owner") or {}
    return str(owner.get("user") or owner.get("uid", "?")) if isinstance(owner, Mapping) else str(owner)


def component_text(c: Doc, verb: str, explain: bool = False, width: int = WIDTH) -> list[str]:
    """What `allocate`/`scale` print: one line per replica, then why if asked; within `width`
    columns (a long name or many pids wrap under the replica's line, the explanation's clauses too)."""
    replicas = c.get("replicas") or []
    lines = wrap(f"{verb} {c['name']}: {len(replicas)} replica{'s' if len(replicas) != 1 else ''} ({c.get('state')})",
                 width)
    for r in replicas:
        pids = ",".join(str(p) for p in r.get("pids") or []) or "-"
        lines += wrap(f"  {r['index']}  {r.get('group') or '-'}  {r.get('role')}  {held_label(r)}  pids {pids}",
                      width, indent="     ")
    if explain:
        lines += wrap(f"why: {c.get('explanation') or 'cgd gave no explanation'}", width, indent="     ")
    return lines


def wrap(text: str, width: int, indent: str = "  ") -> list[str]:
    """`text` on lines of at most `width` columns, those after the first indented; a word longer
    than a line (a path, a long name) is broken rather than let past the edge."""
    if width <= len(indent) + 1:
        indent = ""
    return textwrap.wrap(text, max(1, width), subsequent_indent=indent, break_on_hyphens=False) or [""]


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    return ["  ".join(str(x).ljust(w) for x, w in zip(row, widths, strict=False)).rstrip() for row in (header, *rows)]


Step = tuple[str, int, int]
"""How a table gives up room: `("shrink", column, narrowest)` or `("drop", column, 0)`."""


def fitted_table(header: Sequence[str], rows: Sequence[Sequence[str]], width: int,
                 steps: Sequence[Step], middle: Sequence[int] = ()) -> list[str]:
    """`table` within `width` columns: while it is wider, `steps` are taken in their order, each
    making a column narrower (its cells shortened with `...`; those of `middle`, names, keep their
    start and their end, where names tell apart) or dropping it; room a dropped column leaves goes
    back to the columns narrowed before, in the order of `steps`. A table still too wide is cut."""
    natural = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    widths = list(natural)
    shown = list(range(len(header)))

    def total() -> int:
        return sum(widths[c] for c in shown) + 2 * (len(shown) - 1)

    for action, column, narrowest in steps:
        over = total() - width
        if over <= 0:
            break
        if action == "drop" and column in shown:
            shown.remove(column)
        elif action == "shrink":
            widths[column] -= max(0, min(over, widths[column] - narrowest))
    for column in dict.fromkeys(c for action, c, _ in steps if action == "shrink" and c in shown):
        widths[column] += max(0, min(width - total(), natural[column] - widths[column]))  # room a drop freed
    lines = ["  ".join(shorten(str(row[c]), widths[c], c in middle).ljust(widths[c]) for c in shown).rstrip()
             for row in (header, *rows)]
    return [line if len(line) <= width else shorten(line, width) for line in lines]


def shorten(text: str, width: int, middle: bool = False) -> str:
    """`text` in at most `width` columns, `...` where some of it went: its end, or its middle.

    >>> shorten("a-very-long-component-name-1", 16, middle=True), shorten("0-55,112-167", 8)
    ('a-very-...name-1', '0-55,...')
    """
    if len(text) <= width:
        return text
    if width <= 4:
        return text[:width]
    if middle:
        back = (width - 3) // 2
        return text[:width - 3 - back] + "..." + text[len(text) - back:]
    return text[:width - 3] + "..."


LIST_STEPS: tuple[Step, ...] = (
    ("shrink", 0, 24), ("shrink", 2, 12), ("drop", 6, 0), ("shrink", 0, 16), ("shrink", 2, 10),
    ("shrink", 0, 12), ("shrink", 7, 6), ("drop", 2, 0), ("shrink", 5, 8), ("shrink", 8, 6), ("drop", 7, 0),
    ("drop", 3, 0))
"""How `cgctl list` fits a terminal: long names narrow first, then CPUS goes (on a box of two NUMA
nodes a binding alone is 12 columns), then GROUP, then PIDS; the state, the devices and who holds
them stay longest (`--json` has everything in full). ROLE goes last, or, when every replica is a
primary and it tells nothing, right after GROUP."""
PRIMARIES_ONLY_STEPS: tuple[Step, ...] = (*LIST_STEPS[:8], ("drop", 3, 0), *LIST_STEPS[8:-1])
RESERVATION_STEPS: tuple[Step, ...] = (("shrink", 1, 10), ("shrink", 0, 14), ("shrink", 3, 6), ("drop", 1, 0),
                                       ("shrink", 0, 10), ("shrink", 2, 8))


def list_text(components: Sequence[Doc], reservations: Sequence[Doc], width: int = WIDTH) -> list[str]:
    """The replicas' table, the queue with why each claim waits (wrapped), the reservations'
    table; nothing wider than `width`."""
    if not components and not reservations:
        return wrap("nothing allocated: `cgctl allocate NAME --gpus 1` makes a component", width)
    lines: list[str] = []
    if components:
        rows = []
        for c in components:
            for r in c.get("replicas") or [{}]:
                rows.append([
                    c["name"], str(r.get("index", "-")), r.get("group") or "-", r.get("role") or "-",
                    replica_state(c, r), devices_label(r["devices"]) if r.get("devices") else cpus_label(r),
                    r.get("cpu_binding") or "-", ",".join(str(p) for p in r.get("pids") or []) or "-", owner_name(c),
                ])
        steps = PRIMARIES_ONLY_STEPS if all(row[3] in ("primary", "-") for row in rows) else LIST_STEPS
        lines += fitted_table(["NAME", "REPLICA", "GROUP", "ROLE", "STATE", "GPUS", "CPUS", "PIDS", "OWNER"], rows,
                              width, steps, middle=(0, 2))
        queued = sorted((c for c in components if c.get("queue")), key=lambda c: c["queue"].get("position", 0))
        if queued:
            lines += ["", "queue:"]
            for c in queued:
                lines += wrap(f"  #{c['queue'].get('position')} {c['name']}: {c['queue'].get('reason')}", width,
                              indent="      ")
    if reservations:
        rows = [[r["name"], ", ".join(g["id"] for g in r.get("groups") or []),
                 devices_label(d for g in r.get("groups") or [] for d in g.get("devices") or []),
                 owner_name(r), _expires(r.get("expires_at"))] for r in reservations]
        lines += ([""] if lines else []) + fitted_table(["RESERVATION", "GROUPS", "GPUS", "OWNER", "EXPIRES"], rows,
                                                        width, RESERVATION_STEPS, middle=(0, 1))
    return [shorten(line, width) for line in lines]


def replica_state(c: Doc, r: Doc) -> str:
    """`running`, `pending #2` (its place in the queue), `failed (3)` (its exit code once it ended)."""
    state = r.get("state") or c.get("state") or "-"
    if state == "pending" and c.get("queue"):
        return f"pending #{c['queue'].get('position')}"
    if state in ("completed", "failed", "timeout") and r.get("exit_code") is not None:
        return f"{state} ({r['exit_code']})"
    return str(state)


def _expires(at: float | None, now: float | None = None) -> str:
    if at is None:
        return "never"
    left = at - (time.time() if now is None else now)
    if left <= 0:
        return "expired"
    minutes, seconds = divmod(int(left), 60)
    return f"in {minutes}m{seconds:02d}s" if minutes else f"in {seconds}s"


def bar(parts: Sequence[tuple[float, str]], total: float, style: Style, colour: str, cells: int = BAR_WIDTH) -> str:
    """`[####++------]`: each part a share of `total` drawn with its own mark, in `cells` cells."""
    drawn = ""
    for amount, mark in parts:
        n = round(cells * amount / total) if total else 0
        drawn += mark * max(0, min(n, cells - len(drawn)))
    filled = style(drawn, fg=colour) if drawn else ""
    return f"[{filled}{'-' * (cells - len(drawn))}]"


def level(fraction: float) -> str:
    """The colour of a bar filled to `fraction`: green, yellow from 70%, red from 90%."""
    return "green" if fraction < 0.7 else "yellow" if fraction < 0.9 else "red"


ENDED_SHOWN = 5
"""Ended jobs `status` lists (the latest); `cgctl list` has them all."""


def glance_lines(components: Sequence[Doc], width: int = WIDTH) -> list[str]:
    """The components worth a look, one line each within `width` columns: the queue (place and
    reason), what restarts or is unwell, then the latest jobs that ended and how."""
    ended = [c for c in components if c.get("state") in ("completed", "failed", "timeout")]
    shown = [c for c in components if c not in ended] + ended[:ENDED_SHOWN]
    if not shown:
        return []
    rows = [[_glance_state(c), shorten(str(c["name"]), 24, middle=True), shorten(str(c.get("user") or "?"), 12, True),
             _glance_detail(c)]
            for c in shown]
    lines = ["components:"] + ["  " + _fit(line, width - 2) for line in table(["", "", "", ""], rows)[1:]]
    if len(ended) > ENDED_SHOWN:
        lines.append(f"  and {len(ended) - ENDED_SHOWN} more that ended: `cgctl list` shows them")
    return lines


def _glance_state(c: Doc) -> str:
    queue = c.get("queue") or {}
    return f"pending #{queue.get('position', '?')}" if c.get("state") == "pending" else str(c.get("state"))


def _glance_detail(c: Doc) -> str:
    state, restarts = c.get("state"), int(c.get("restarts") or 0)
    again = f", {restarts} restart{'s' if restarts != 1 else ''}" if restarts else ""
    if state == "pending":
        return str((c.get("queue") or {}).get("reason") or "waiting for capacity")
    if state in ("completed", "failed", "timeout"):
        took = f" after {c['duration_s']:.1f}s" if c.get("duration_s") is not None else ""
        return f"exit {c.get('exit_code')}{took}{again}"
    if state == "degraded":
        return "one of its GPUs is unhealthy" + again
    if state == "lost":
        return "its GPUs left the machine: release it"
    return again.removeprefix(", ")


def _fit(line: str, width: int) -> str:
    return line if len(line) <= width else line[:width - 3] + "..."


def state_loss_lines(lost: list[Doc], style: Style) -> list[str]:
    """First in the status, so it is not missed: cgd runs workers its state no longer knows."""
    if not lost:
        return []
    lines = [style("WARNING", fg="red", bold=True) + " cgd's state lost a generation; still running, not counted:"]
    lines += [f"  {w['replica']} of {w['user']} (pids {', '.join(map(str, w['pids']))}; "
              f"devices {w['devices'] or 'none'})" for w in lost]
    return [*lines, "  `cgctl ack-state-loss` once looked at (root)", ""]
