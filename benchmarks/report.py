"""Tables, percentiles and the machine line every benchmark section shares.

A figure means little without the machine it was taken on and the baseline
measured beside it, so every section returns `Table`s (rows plus notes that
say what was compared) and the entry point prints them with the machine
description on top, as text for a terminal or Markdown for docs/performance.md.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Table:
    """One section's figures: `columns` name the cells of each row in `rows`."""

    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: Any) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{self.title}: {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(list(cells))

    def note(self, text: str) -> None:
        self.notes.append(text)


def skipped(title: str, reason: str) -> Table:
    """A section that could not run here still shows up, saying why."""
    return Table(title, [], notes=[f"skipped: {reason}"])


def fmt(value: Any) -> str:
    """Numbers with as many digits as their size deserves; None is a dash."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return str(value)
        size = abs(value)
        if size >= 100:
            return f"{value:.0f}"
        if size >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    return str(value)


def ratio(ours: float | None, theirs: float | None) -> str:
    """`ours / theirs` as `1.23x`; a dash when either side is missing or zero."""
    if ours is None or theirs is None or theirs == 0:
        return "-"
    value = ours / theirs
    return f"{value:.0f}x" if value >= 100 else f"{value:.3g}x" if value < 0.1 else f"{value:.2f}x"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: a p99 of 50 samples is their maximum, never an interpolation."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def ms(seconds: float) -> float:
    return seconds * 1e3


def mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def render_text(table: Table) -> str:
    lines = [table.title, "-" * len(table.title)]
    if table.columns and table.rows:
        cells = [[fmt(c) for c in row] for row in table.rows]
        widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(table.columns)]
        numeric = [all(_is_number(row[i]) for row in table.rows) for i in range(len(table.columns))]
        lines.append("  ".join(_pad(h, w, n) for h, w, n in zip(table.columns, widths, numeric, strict=True)))
        for row in cells:
            lines.append("  ".join(_pad(c, w, n) for c, w, n in zip(row, widths, numeric, strict=True)))
    lines.extend(f"  {note}" for note in table.notes)
    return "\n".join(lines)


def render_markdown(table: Table) -> str:
    lines = [f"### {table.title}", ""]
    if table.columns and table.rows:
        lines.append("| " + " | ".join(table.columns) + " |")
        lines.append("|" + "|".join(" ---: " if all(_is_number(r[i]) for r in table.rows) else " --- "
                                    for i in range(len(table.columns))) + "|")
        lines.extend("| " + " | ".join(fmt(c) for c in row) + " |" for row in table.rows)
        lines.append("")
    lines.extend(f"- {note}" for note in table.notes)
    return "\n".join(lines).rstrip() + "\n"


def machine_description() -> dict[str, str]:
    """What a reader needs to compare these figures with theirs."""
    return {
        "cpus": str(os.cpu_count() or "?"),
        "cpu model": _cpu_model(),
        "memory": _memory(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m benchmarks " + " ".join(sys.argv[1:]),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.0f} GiB"
    except OSError:
        pass
    return "unknown"


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) or value is None


def _pad(text: str, width: int, right: bool) -> str:
    return text.rjust(width) if right else text.ljust(width)


def run_standalone(doc: str | None, run: Callable[[bool], list[Table]]) -> None:
    """`python -m benchmarks.X [--quick]`: one section alone, printed as text."""
    import argparse

    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    parser.add_argument("--quick", action="store_true")
    for table in run(parser.parse_args().quick):
        print(render_text(table), end="\n\n")
