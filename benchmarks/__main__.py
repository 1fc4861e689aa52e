"""`python -m benchmarks`: every benchmark in one run, each beside its baseline.

    python -m benchmarks [--quick] [--only NAME[,NAME]] [--markdown FILE]

One table per measurement, printed as soon as its section ends, under a
description of this machine: figures from different machines or different
runs are not comparable, so every ratio is against a baseline measured in the
same run. `--markdown` also writes the whole report as Markdown (what
docs/performance.md holds).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import baselines, e2e, failover, inprocess, queue, raybench, recovery
from benchmarks.report import Table, machine_description, render_markdown, render_text

Section = Callable[[bool], list[Table]]

SECTIONS: dict[str, tuple[str, Section]] = {
    "allocator": ("placement decisions and packing, against first-fit", inprocess.allocator),
    "statefiles": ("durable state commits, against one fsync'd write", inprocess.state),
    "api": ("allocate + release over the socket with 1, 8, 32 clients; start a worker",
            lambda quick: [*e2e.api(quick), e2e.worker_cycle(quick)]),
    "cli": ("cgctl start-up and cgctl allocate until the worker runs", lambda quick: [e2e.cli(quick)]),
    "queue": ("a trace of 60 jobs through the wait queue, against clients that retry", queue.run),
    "failover": ("shadow promotion against a cold restart", failover.run),
    "recovery": ("kill -9 of the manager with 100 workers; idle cost", recovery.run),
    "safety": ("double booking under concurrent clients", baselines.run),
    "ray": ("Ray with logical GPUs (optional extra)", raybench.run),
}


def parse(argv: list[str] | None) -> argparse.Namespace:
    listing = "\n".join(f"  {name:11} {what}" for name, (what, _) in SECTIONS.items())
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.splitlines()[0],
        epilog=f"sections:\n{listing}", formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer samples: a smoke run of a few minutes")
    parser.add_argument("--only", action="append", default=[], metavar="NAME[,NAME]",
                        help="run only these sections (repeatable)")
    parser.add_argument("--markdown", metavar="FILE", type=Path, help="also write the report as Markdown")
    args = parser.parse_args(argv)
    args.only = [name for item in args.only for name in item.split(",") if name]
    unknown = sorted(set(args.only) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    machine = machine_description()
    print("\n".join(f"{key:10} {value}" for key, value in machine.items()), end="\n\n", flush=True)
    markdown = ["| | |", "| --- | --- |", *(f"| {key} | {value} |" for key, value in machine.items()), ""]
    for name, (_, section) in SECTIONS.items():
        if args.only and name not in args.only:
            continue
        begin = time.perf_counter()
        for table in section(args.quick):
            print(render_text(table), end="\n\n", flush=True)
            markdown.append(render_markdown(table))
        print(f"[{name}: {time.perf_counter() - begin:.0f} s]", end="\n\n", flush=True)
    if args.markdown:
        args.markdown.write_text("\n".join(markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
