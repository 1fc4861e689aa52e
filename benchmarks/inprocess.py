"""The parts measured inside one process, as tables: the allocator and the state commit.

The measurements are those of `benchmarks.allocator` and
`benchmarks.statefiles` (their functions, their machines, their seeded
trace); this module only lays them out beside the baselines they already
carry: first-fit for the allocator, one fsync'd write for the state commit.
"""

from __future__ import annotations

from benchmarks import allocator as alloc
from benchmarks import statefiles
from benchmarks.report import Table, ms, percentile, ratio


def decisions(quick: bool) -> Table:
    count = 200 if quick else 1000
    table = Table("Allocator: one placement decision (a mix of whole, multi-GPU, NVLink-colocated, "
                  "exclusive and share claims)",
                  ["machine", "live groups", "decisions/s", "p50 ms", "p99 ms", "first-fit decisions/s",
                   "time vs first-fit"])
    for name, machine in alloc.machines():
        for live in (0, 100, 1000):
            allocator = alloc.with_live_groups(machine, live)
            alloc.time_decisions(allocator, len(alloc.speed_claims()) * 2)
            times = alloc.time_decisions(allocator, count)
            naive = alloc.first_fit_times(machine, live, count)
            table.add(name, live, len(times) / sum(times), ms(percentile(times, 50)), ms(percentile(times, 99)),
                      len(naive) / sum(naive), ratio(percentile(times, 50), percentile(naive, 50)))
    table.note("first-fit: the lowest free indices, no topology (benchmarks/allocator.py `FirstFit`), "
               "on the same claims and the same live groups. Each decision is released again.")
    return table


def packing(quick: bool) -> Table:
    steps = 300 if quick else 2000
    table = Table(f"Allocator packing: a seeded trace of {steps} allocations and releases "
                  "(a third whole GPUs, a third 2-8 GPUs, a third shares)",
                  ["machine", "accepted", "first-fit accepted", "ratio", "NVLinks per multi-GPU group",
                   "first-fit NVLinks", "ratio "])
    for name, machine in alloc.machines():
        events = alloc.trace(seed=42, steps=steps, gpus=len(machine.gpus))
        ours = alloc.replay(machine, events, ours=True)
        base = alloc.replay(machine, events, ours=False)
        table.add(name, f"{ours.accepted / ours.attempted:.1%}", f"{base.accepted / base.attempted:.1%}",
                  ratio(ours.accepted, base.accepted), float(ours.mean_multi()), float(base.mean_multi()),
                  ratio(ours.mean_multi(), base.mean_multi()))
    table.note("NVLinks: the sum over GPU pairs of a multi-GPU group of their NVLink count, averaged: "
               "what collective operations run on.")
    return table


def commits(quick: bool) -> Table:
    table = Table("State commit: one durable transaction (lock, find the change, validate it, append, fsync)",
                  ["groups", "snapshot KiB", "commits", "p50 ms", "p99 ms", "fsync'd append p50 ms",
                   "time vs append", "snapshot commit p50 ms", "of which CPU ms", "lock per commit p50 ms"])
    for r in statefiles.run(quick):
        table.add(r["groups"], r["bytes"] / 1024, r["commits"], r["commit_ms"]["p50"], r["commit_ms"]["p99"],
                  r["floor_ms"]["p50"], f"{r['ratio_p50']:.2f}x", r["snapshot_ms"]["p50"], r["cpu_ms"],
                  r["unheld_ms"]["p50"])
    table.note("fsync'd append: the same journal line appended once and fsync'd in the same directory, "
               "interleaved with the commits (benchmarks/statefiles.py); the floor of any durable change. "
               "Every 1000th commit also writes a snapshot of the whole document (its CPU part in the "
               "'of which CPU' column). The store keeps its file lock between commits, as cgd's does; "
               "the last column takes and drops filelock's lock per commit, as a writer without cgd would.")
    return table


def allocator(quick: bool = False) -> list[Table]:
    return [decisions(quick), packing(quick), alloc.lookahead_table(quick), alloc.shares_table(quick)]


def state(quick: bool = False) -> list[Table]:
    return [commits(quick)]
