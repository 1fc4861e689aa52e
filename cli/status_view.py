"""The compact status: one line per GPU, as `cgctl status` and `cgctl top` draw it.

Pure functions of cgd's documents (`GET /v1/status`, `/v1/components`,
`/v1/reservations`, `/v1/groups`), so every picture is tested from JSON without
a daemon or a terminal. `/v1/status` says who is on each GPU; the component and
reservation documents say in which state and role, so a crash-looping worker,
a shadow and a reservation read differently; the group documents tell a group
made on its own (owner `@UID`), which holds memory with no component on it. The GPU's own `components` list
stays the truth of who is on it: a name the other documents do not know yet
(they were read a moment apart) shows with state `-`.

Every line is cut to the width it is given, so a narrow terminal never wraps.

NVML's numbers are one sample of the health loop; when that sample is old
(the loop stuck, NVML hanging) they read `?` and an alert says how old,
rather than passing old numbers off as the current ones. How old is too old
is measured against the `now` of the look, so a picture stays pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

import click

from computegroups.cli.render import Doc, Json, Style, glance_lines, shorten, size, state_loss_lines
from computegroups.cli.terminal import WIDTH
from computegroups.topology.names import VENDOR_WORDS

STATE_WORDS = {"running": "run", "starting": "start", "allocated": "held", "reservation": "reserved",
               "own group": "group"}
"""How a state reads in a GPU line when a shorter word says the same; the others read as cgd names them."""
SEVERITY = ("failed", "lost", "degraded", "timeout", "restarting", "starting", "running", "allocated",
            "shadow", "completed", "reservation", "own group", "pending")
"""Which occupants a GPU line names first: what needs a look, then what works, then what only holds."""
ALERT_STATES = ("restarting", "failed", "degraded", "lost", "timeout")
FORM_FACTOR = re.compile(r"^(sxm\d*|pcie|hbm\d*e?|nvl|nvlink)$", re.IGNORECASE)
MODEL_WIDTH = 9
BAR_CELLS = 8
STALE_AFTER_S = 10.0
"""A sample older than this is stale when cgd does not say its health loop's period (an older cgd);
otherwise `cgctl` takes three periods (`interval_s` of `GET /v1/health`)."""



class Occupant(NamedTuple):
    """One component or reservation on one GPU, in the state it has there."""

    name: str
    user: str | None
    state: str
    """A replica or component state, or `shadow` (a standby running), `reservation`, or `own group`
    (a group made by `cgctl group create` that no component uses: `name` is its id)."""
    memory_used_mib: int | None


def short_model(name: str | None) -> str:
    """`H100 80GB` for `NVIDIA H100 80GB HBM3`, `V100 16GB` for `Tesla V100-SXM2-16GB`:
    the vendor and the form factor go, the chip and its memory stay."""
    words = [w for w in re.split(r"[\s-]+", name or "") if w]
    words = [w for w in words if w.lower() not in VENDOR_WORDS and not FORM_FACTOR.match(w)]
    return " ".join(words)[:MODEL_WIDTH] or "-"


def occupants(gpu: Doc, components: Mapping[str, Doc], reservations: Mapping[str, Doc],
              own_groups: Mapping[str, Doc] = MappingProxyType({})) -> list[Occupant]:
    """Who is on `gpu` and how each is doing there, the most worrying first; a group of its own that
    no component uses holds the GPU's memory as a reservation does, so it is named as one is."""
    found = [Occupant(gid, None, "own group", None) for gid in gpu.get("groups") or []
             if gid in own_groups and not own_groups[gid].get("users")]
    for entry in gpu.get("components") or []:
        name, measured = _entry(entry)
        if name in components:
            c = components[name]
            found.append(Occupant(name, _user(c), _state_on(c, gpu["index"]), measured))
        elif name in reservations:
            found.append(Occupant(name, _user(reservations[name]), "reservation", measured))
        else:
            found.append(_as_listed(name, entry, measured))
    return sorted(found, key=lambda o: (_rank(o.state), o.name))


def _entry(entry: Any) -> tuple[str, int | None]:
    """A GpuStatus `components` entry: a name, or `{"name", "memory_used_mib", ...}` where cgd measures it."""
    if isinstance(entry, Mapping):
        return str(entry.get("name")), entry.get("memory_used_mib")
    return str(entry), None


def _as_listed(name: str, entry: Any, measured: int | None) -> Occupant:
    """An occupant the component and reservation documents do not know (read a moment apart): as
    the GPU's own entry tells it (the component's state, not its replicas'), `-` when it does not."""
    if not isinstance(entry, Mapping) or entry.get("state") is None:
        return Occupant(name, None, "-", measured)
    state = str(entry["state"])
    if entry.get("reservation"):
        state = "reservation"
    elif entry.get("shadow_of") and state == "running":
        state = "shadow"
    return Occupant(name, entry.get("user"), state, measured)


def _user(doc: Doc) -> str | None:
    owner = doc.get("owner")
    return str(owner.get("user") or owner.get("uid")) if isinstance(owner, Mapping) else None


def _state_on(c: Doc, index: int) -> str:
    """The component's state on GPU `index`: the worst of its replicas there, `shadow` for a running standby."""
    states = []
    for r in c.get("replicas") or []:
        if any(d.get("index") == index for d in r.get("devices") or []):
            state = str(r.get("state") or c.get("state"))
            states.append("shadow" if state == "running" and r.get("role") == "shadow" else state)
    return min(states, key=_rank) if states else str(c.get("state") or "-")


def _rank(state: str) -> int:
    return SEVERITY.index(state) if state in SEVERITY else len(SEVERITY)


def _word(state: str) -> str:
    return STATE_WORDS.get(state, state)


def _gib(mib: float | None) -> str:
    if mib is None:
        return "-"
    gib = mib / 1024
    return f"{gib:.0f}" if gib >= 99.95 else f"{gib:.1f}"


def _measured(gpu: Doc, key: str) -> Any:
    return (gpu.get("measured") or {}).get(key)


def _temperature(gpu: Doc) -> int | None:
    value = _measured(gpu, "temperature_c")
    return value if value is not None else gpu.get("temperature_c")


def marks(gpu: Doc) -> list[str]:
    """What is wrong with or special about the GPU, in capitals so it is not missed."""
    found = []
    if gpu.get("health") not in (None, "ok"):
        found.append(str(gpu["health"]).upper())
    found += [word for key, word in (("degraded", "DEGRADED"), ("drained", "DRAINED"),
                                     ("foreign_processes", "FOREIGN"), ("over_share", "OVER-SHARE"),
                                     ("held_by_lost", "HELD"))
              if gpu.get(key)]
    return found


class Cells(NamedTuple):
    """One line's columns before they are laid out: a GPU, or an NVLink island of them."""

    label: str
    model: str
    util: str
    used_mib: float | None
    claimed_mib: float
    total_mib: float
    temperature: str
    marks: list[str]
    occupants: list[Occupant]
    stale: bool = False
    """Whether the measured values are too old to show (they read `?`)."""


def gpu_cells(gpu: Doc, on_it: list[Occupant], stale: bool = False) -> Cells:
    """The GPU's columns; with `stale`, what NVML measured reads `?` (the numbers are old)."""
    if stale:
        return Cells(str(gpu["index"]), short_model(gpu.get("name")), "?", None,
                     gpu.get("memory_allocated_mib") or 0, gpu.get("memory_mib") or 0, "?", marks(gpu), on_it,
                     stale=True)
    util = _measured(gpu, "utilization_gpu_pct")
    temperature = _temperature(gpu)
    return Cells(str(gpu["index"]), short_model(gpu.get("name")), "-" if util is None else f"{util}%",
                 _measured(gpu, "memory_used_mib"),
                 gpu.get("memory_allocated_mib") or 0,
                 gpu.get("memory_mib") or 0, "-" if temperature is None else f"{temperature}C",
                 marks(gpu), on_it)


def island_cells(gpus: Sequence[Doc], on_it: Sequence[list[Occupant]], stale: Sequence[bool]) -> Cells:
    """An island as one line: mean utilisation, summed memory, the hottest GPU, everyone on it;
    of the GPUs whose sample is fresh (`?` when none is)."""
    fresh = [g for g, old in zip(gpus, stale, strict=True) if not old]
    utils = [u for g in fresh if (u := _measured(g, "utilization_gpu_pct")) is not None]
    used = [u for g in fresh if (u := _measured(g, "memory_used_mib")) is not None]
    temps = [t for g in fresh if (t := _temperature(g)) is not None]
    unknown = "?" if not fresh else "-"
    merged: dict[str, Occupant] = {}
    for o in (o for found in on_it for o in found):
        if o.name not in merged or _rank(o.state) < _rank(merged[o.name].state):
            merged[o.name] = o
    counted: dict[str, int] = {}
    for m in (m for g in gpus for m in marks(g)):
        counted[m] = counted.get(m, 0) + 1
    models = {short_model(g.get("name")) for g in gpus}
    return Cells(_span([g["index"] for g in gpus]), models.pop() if len(models) == 1 else "mixed",
                 f"{sum(utils) // len(utils)}%" if utils else unknown, sum(used) if used else None,
                 sum(g.get("memory_allocated_mib") or 0 for g in gpus),
                 sum(g.get("memory_mib") or 0 for g in gpus), f"{max(temps)}C" if temps else unknown,
                 [f"{n} {m}" if n > 1 else m for m, n in counted.items()],
                 sorted(merged.values(), key=lambda o: (_rank(o.state), o.name)), stale=not fresh)


def _span(indices: Sequence[int]) -> str:
    ordered = sorted(indices)
    if ordered == list(range(ordered[0], ordered[-1] + 1)) and len(ordered) > 1:
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(map(str, ordered))


def memory_bar(used: float | None, claimed: float, total: float) -> str:
    """`[##==----]`: `#` measured in use, `=` claimed beyond that, `-` free; `?` in use not measured."""
    if not total:
        return "[" + "-" * BAR_CELLS + "]"
    claimed_cells = min(BAR_CELLS, round(BAR_CELLS * claimed / total))
    if used is None:
        return "[" + "?" * claimed_cells + "-" * (BAR_CELLS - claimed_cells) + "]"
    used_cells = min(BAR_CELLS, round(BAR_CELLS * used / total))
    claimed_cells = max(claimed_cells, used_cells)
    return "[" + "#" * used_cells + "=" * (claimed_cells - used_cells) + "-" * (BAR_CELLS - claimed_cells) + "]"


def _columns(width: int) -> tuple[bool, bool]:
    """Whether the memory bar and the model fit beside room enough to name someone: on a narrow
    terminal the bar goes first, then the model; who is on the GPU stays."""
    return width >= 71, width >= 56


def line(cells: Cells, width: int, label_width: int, style: Style, users: bool = False) -> str:
    """`  3 H100 80GB  87% [###=----] 24.1/40.0G 45C  web:run web-sb:shadow +1`, never past `width`;
    with `users`, each occupant as `ada/web:run`."""
    with_bar, with_model = _columns(width)
    memory = f"{'?' if cells.stale else _gib(cells.used_mib)}/{_gib(cells.claimed_mib)}G"
    head = (f"{cells.label:>{label_width}} " + (f"{cells.model:<{MODEL_WIDTH}} " if with_model else "")
            + f"{cells.util:>4} "
            + (f"{memory_bar(cells.used_mib, cells.claimed_mib, cells.total_mib)} " if with_bar else "")
            + f"{memory:>10} {cells.temperature:>4}")
    if len(head) >= width:
        return head[:width].rstrip()
    tokens = [(m, style(m, fg=mark_colour(m), bold=True)) for m in cells.marks]
    tokens += [(name, style(name, fg=state_colour(o.state)))
               for name, o in ((occupant_label(o, users), o) for o in cells.occupants)]
    return head + _fit_tokens(tokens, width - len(head) - 2, prefix="  ", named=len(cells.marks))


def mark_colour(mark: str) -> str:
    """Yellow for what only limits the GPU (`DRAINED`, `2 FOREIGN` in an island), red for what is wrong with it."""
    return "yellow" if mark.split()[-1] in ("DRAINED", "FOREIGN", "OVER-SHARE", "HELD") else "red"


def occupant_label(o: Occupant, users: bool) -> str:
    who = f"{o.user}/{o.name}" if users and o.user else o.name
    return f"{who}:{_word(o.state)}"


def state_colour(state: str) -> str | None:
    if state in ("failed", "lost", "timeout"):
        return "red"
    if state in ("restarting", "degraded", "starting"):
        return "yellow"
    if state in ("shadow", "reservation", "own group", "pending"):
        return "cyan"
    return "green" if state == "running" else None


def _fit_tokens(tokens: Sequence[tuple[str, str]], room: int, prefix: str, named: int = 0) -> str:
    """As many tokens as fit in `room` columns, then `+N` for the rest; a first token too long, or
    the token at `named` (the first occupant after the marks, so that a drained GPU still says
    who is on it), is cut."""
    if not tokens or room <= 0:
        return ""
    shown: list[str] = []
    used = 0
    for i, (plain, styled) in enumerate(tokens):
        rest = len(tokens) - i - 1
        more = f" +{rest}" if rest else ""
        need = used + (1 if shown else 0) + len(plain)
        if need + len(more) <= room:
            shown.append(styled)
            used = need
            continue
        left = len(tokens) - i
        if not shown or i == named:
            before = used + 1 if shown else 0
            cut = room - before - len(more)
            if cut >= 4:  # a name keeps its start and its end (and so its state), as `cgctl list`'s do
                return prefix + " ".join([*shown, shorten(plain, cut, middle=True)]) + more
            if not shown:
                return prefix + f"+{left}"[:room]
        return prefix + " ".join(shown) + f" +{left}"
    return prefix + " ".join(shown)


def header(label_width: int, width: int) -> str:
    with_bar, with_model = _columns(width)
    memory = f"{'MEMORY used/claimed':<21}" if with_bar else f"{'USED/CLAIM':>10}"
    text = (f"{'GPU':>{label_width}} " + (f"{'MODEL':<{MODEL_WIDTH}} " if with_model else "") + "UTIL "
            + f"{memory} TEMP  ON IT")
    return text[:width].rstrip()


class Board(NamedTuple):
    """What one look at cgd gathered, read apart into what the screen shows."""

    status: Doc
    components: dict[str, Doc]
    reservations: dict[str, Doc]
    now: float | None = None
    """When the look was taken (Unix time, cgd's clock on the same host): measurements older than
    `stale_after_s` by then are stale. None: none is (a picture of documents alone)."""
    stale_after_s: float = STALE_AFTER_S
    own_groups: Mapping[str, Doc] = MappingProxyType({})
    """Groups made on their own (`cgctl group create`, owner `@UID`) by id, from `GET /v1/groups`."""

    @classmethod
    def of(cls, status: Doc, components: Iterable[Doc], reservations: Iterable[Doc],
           now: float | None = None, stale_after_s: float = STALE_AFTER_S, groups: Iterable[Doc] = ()) -> Board:
        return cls(status, {c["name"]: c for c in components}, {r["name"]: r for r in reservations},
                   now, stale_after_s, {g["id"]: g for g in groups if str(g.get("owner") or "").startswith("@")})

    def age(self, gpu: Doc) -> float | None:
        """How many seconds old the GPU's sample was at `now` (None: no sample, or no `now`)."""
        sampled = _measured(gpu, "sampled_at")
        return None if self.now is None or sampled is None else self.now - sampled

    def stale(self, gpu: Doc) -> bool:
        age = self.age(gpu)
        return age is not None and age > self.stale_after_s

    @property
    def gpus(self) -> list[Doc]:
        return list(self.status.get("gpus") or [])

    def on(self, gpu: Doc) -> list[Occupant]:
        return occupants(gpu, self.components, self.reservations, self.own_groups)

    @property
    def shared(self) -> bool:
        """Whether more than one user holds GPUs: then each occupant is named with its user."""
        return len({o.user for g in self.gpus for o in self.on(g) if o.user}) > 1


HOLDS_NOTHING = ("pending", "completed", "failed", "timeout")
"""Component states in which a component holds no CPUs (queued, or ended and given them back)."""


def cpu_only(board: Board) -> list[tuple[Occupant, int]]:
    """The components that hold CPUs and no device, with how many CPUs: no GPU line names them,
    so without this a CPU-only job shows nowhere but in the counts."""
    found = []
    for c in board.components.values():
        replicas = [r for r in c.get("replicas") or [] if not r.get("devices") and r.get("cpus")]
        if not replicas or c.get("state") in HOLDS_NOTHING:
            continue
        state = min((str(r.get("state") or c.get("state")) for r in replicas), key=_rank)
        found.append((Occupant(str(c["name"]), _user(c), state, None), sum(int(r["cpus"]) for r in replicas)))
    return sorted(found, key=lambda f: (_rank(f[0].state), f[0].name))


def cpu_line(board: Board, width: int, style: Style) -> list[str]:
    """`CPU only: 12 CPUs  prep:run etl:held`: who holds CPUs alone; no line when no one does."""
    found = cpu_only(board)
    if not found:
        return []
    total = sum(n for _, n in found)
    head = f"CPU only: {total} CPU{'s' if total != 1 else ''}"
    users = board.shared
    tokens = [(label, style(label, fg=state_colour(o.state))) for o, _ in found
              for label in [occupant_label(o, users)]]
    return [head + _fit_tokens(tokens, width - len(head) - 2, prefix="  ")]


def gpu_lines(board: Board, width: int, style: Style) -> list[str]:
    gpus = board.gpus
    label_width = max([3, *(len(str(g["index"])) for g in gpus)])
    users = board.shared
    return [header(label_width, width),
            *(line(gpu_cells(g, board.on(g), board.stale(g)), width, label_width, style, users)
              for g in gpus)]


def island_lines(board: Board, islands: Sequence[Sequence[int]], expanded: set[int], width: int,
                 style: Style) -> list[tuple[int | None, str]]:
    """One line per NVLink island, `+` before a folded one, `-` before an open one with its GPUs
    below it; an island of one GPU is that GPU's line, with nothing to open. Each line comes
    with the island it belongs to (None for the header)."""
    by_index = {g["index"]: g for g in board.gpus}
    users = board.shared
    label_width = max([5, *(len(_span(i)) for i in islands)])
    lines: list[tuple[int | None, str]] = [(None, "  " + header(label_width, width - 2))]
    for n, island in enumerate(islands):
        gpus = [by_index[i] for i in island if i in by_index]
        if not gpus:
            continue
        if len(gpus) == 1:
            lines.append((n, "  " + line(gpu_cells(gpus[0], board.on(gpus[0]), board.stale(gpus[0])), width - 2,
                                         label_width, style, users)))
            continue
        mark = "- " if n in expanded else "+ "
        cells = island_cells(gpus, [board.on(g) for g in gpus], [board.stale(g) for g in gpus])
        lines.append((n, mark + line(cells, width - 2, label_width, style, users)))
        if n in expanded:
            lines += [(n, "  " + line(gpu_cells(g, board.on(g), board.stale(g)), width - 2, label_width,
                                      style, users))
                      for g in gpus]
    return [(n, clip(text, width)) for n, text in lines]


def summary(board: Board) -> dict[str, Json]:
    """The counts under the GPU lines: GPUs in use, components by state, the queue, the alerts."""
    gpus = board.gpus
    states: dict[str, int] = {}
    for c in board.components.values():
        state = str(c.get("state"))
        if c.get("shadow_of") and state == "running":
            state = "shadow"
        states[state] = states.get(state, 0) + 1
    return {
        "gpus": len(gpus),
        "gpus_in_use": sum(1 for g in gpus if g.get("groups")),
        "components": len(board.components),
        "components_by_state": dict(sorted(states.items(), key=lambda kv: (_rank(kv[0]), kv[0]))),
        "reservations": len(board.reservations),
        "pending": sum(1 for c in board.components.values() if c.get("state") == "pending"),
        "alerts": alerts(board),
    }


def alerts(board: Board) -> list[str]:
    """One short sentence per thing that wants a person: a GPU in trouble, measurements gone
    stale, a component failing, lost state."""
    found = []
    if old := [g for g in board.gpus if board.stale(g)]:
        found.append(f"stale: GPU {_span([g['index'] for g in old])} last measured "
                     f"{max(board.age(g) or 0 for g in old):.0f}s ago")
    found += [f"GPU {g['index']} {' '.join(marks(g))}" + (f": {'; '.join(why)}" if (why := reasons(g)) else "")
             for g in board.gpus if set(marks(g)) - {"DRAINED"}]
    found += [f"{c['name']} {c['state']}" for c in (board.status.get("components") or [])
              if c.get("state") in ALERT_STATES]
    found += [f"group {grp['id']} lost its devices" for grp in board.status.get("lost_groups") or []]
    found += [f"{w['replica']} kept from a lost state generation" for w in board.status.get("state_loss") or []]
    return found


def reasons(gpu: Doc) -> list[str]:
    """Why the GPU is marked, in words: cgd's reasons, the foreign pids, the workers of a lost generation."""
    foreign = [f"pid {p.get('pid')} ({size(p.get('used_memory_mib'))})" for p in gpu.get("foreign_processes") or []]
    held = [f"held by {h.get('replica')} of {h.get('user')} (lost state generation)"
            for h in gpu.get("held_by_lost") or []]
    return [*map(str, gpu.get("reasons") or []), *foreign, *held]


def summary_lines(board: Board, width: int) -> list[str]:
    """`8/8 GPUs used | 1 restarting, 6 run, 1 shadow | 1 reserved | 1 queued | 1 alert`: the
    components counted by state at every width. When it is wider than `width`, the counts that
    are zero go first (`0 reserved`, `0 queued`); then it wraps between its parts (the next line
    begins `| `) or between states (the line before ends in `,`), and only a part wider than a
    line alone is cut."""
    s = summary(board)
    states = [f"{n} {_word(state)}" for state, n in s["components_by_state"].items() if state != "pending"]
    alerts = len(s["alerts"])
    parts = [[f"{s['gpus_in_use']}/{s['gpus']} GPUs used"],
             [f"{text}," for text in states[:-1]] + states[-1:] or ["no components"],
             [f"{s['reservations']} reserved"], [f"{s['pending']} queued"],
             [f"{alerts} alert{'s' if alerts != 1 else ''}"]]
    text = " | ".join(" ".join(words) for words in parts)
    if len(text) <= width:
        return [text]
    parts = [words for words in parts if words not in (["0 reserved"], ["0 queued"])]
    text = " | ".join(" ".join(words) for words in parts)
    if len(text) <= width:
        return [text]
    lines: list[str] = []
    for words in parts:
        for n, word in enumerate(words):
            joined = f"{lines[-1]}{' ' if n else ' | '}{word}" if lines else ""
            if lines and len(joined) <= width:
                lines[-1] = joined
            else:  # a new line goes on from the part before it (`| `) or the state before it (`, ` ended it)
                lines.append(_cut(f"{'  ' if n else '| '}{word}" if lines else word, width))
    return lines


def tail_lines(board: Board, width: int, style: Style) -> list[str]:
    """Under the summary: the components on CPUs alone (no GPU line names them), each alert on a
    line, lost groups, then the queue and the jobs that ended; the same under folded islands."""
    lines = [*cpu_line(board, width, style), *(_cut(f"  ! {a}", width) for a in summary(board)["alerts"])]
    glance = glance_lines(board.status.get("components") or [], width)
    return [*lines, *([""] if glance else []), *glance]


def _cut(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    return text[:width - 3] + "..." if width > 6 else text[:width]


def clip(text: str, width: int) -> str:
    """`text` cut to `width` columns as it shows: its colour codes take none (and go where it is cut)."""
    bare = click.unstyle(text)
    return text if len(bare) <= width else _cut(bare, width)


def status_lines(board: Board, style: Style, width: int = WIDTH) -> list[str]:
    """`cgctl status`: the state loss warning if any, one line per GPU, the summary, what wants a look."""
    lines = [*state_loss_lines(board.status.get("state_loss") or [], style), *gpu_lines(board, width, style),
             "", *summary_lines(board, width), *tail_lines(board, width, style)]
    return [clip(text, width) for text in lines]


GPU_KEYS = ("index", "uuid", "name", "memory_mib", "memory_allocated_mib", "memory_foreign_mib",
            "compute_allocated_pct", "exclusive_owner", "groups", "health", "reasons", "drained", "degraded",
            "foreign_processes", "over_share", "held_by_lost", "mig_devices", "temperature_c")
MEASURED_KEYS = ("utilization_gpu_pct", "utilization_memory_pct", "memory_used_mib", "temperature_c", "sampled_at")


def status_json(board: Board) -> dict[str, Json]:
    """`cgctl status --json`: the keys docs/cli.md promises, whatever else cgd's documents carry."""
    status = board.status
    gpus = []
    for g in board.gpus:
        measured = g.get("measured")
        gpus.append({
            **{k: g.get(k) for k in GPU_KEYS},
            "components": [_entry(e)[0] for e in g.get("components") or []],
            "measured": ({**{k: measured.get(k) for k in MEASURED_KEYS}, "stale": board.stale(g)}
                         if isinstance(measured, Mapping) else None),
            "occupants": [o._asdict() for o in board.on(g)],
        })
    return {"generation": status.get("generation"), "gpus": gpus, "lost_groups": status.get("lost_groups") or [],
            "own_groups": list(board.own_groups.values()),
            "state_loss": status.get("state_loss") or [], "components": status.get("components") or [],
            "summary": summary(board)}
