"""How fast the allocator decides, and how well it packs against first-fit.

Run from the repository root: `python benchmarks/allocator.py [--quick]`.

Speed: decisions per second and p50/p99 latency of one `allocate` for 8, 16
and 72 GPUs with 0, 100 and 1000 live groups (the live groups are small
shares on half of the GPUs, so whole and multi-GPU claims still fit). Each
decision is released again so the state stays the same.

Packing: a seeded random trace of allocations and releases mixing whole,
multi-GPU and fractional claims, replayed through the allocator and through a
first-fit baseline written here (lowest free indices, as simple local
allocators do). It reports acceptance rate and the mean NVLink score (sum
over pairs of NVLink counts) of multi-GPU groups, each as a ratio against the
baseline. Timings are printed, never asserted: tests do not time things.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from computegroups.daemon.model.claims import Claim, Strategy
from computegroups.daemon.placement.allocator import Allocator, PlacementError
from computegroups.topology import load_machine
from computegroups.topology.model import DomainKind, Machine

GIB = 1024


def sub_machine(machine: Machine, keep: range, name: str) -> Machine:
    """The first GPUs of a simulated machine, as a machine of their own."""
    kept = set(keep)
    return Machine(
        hostname=name, gpus=tuple(g for g in machine.gpus if g.index in kept),
        links=tuple(link for link in machine.links if link.a in kept and link.b in kept),
        numa_nodes=machine.numa_nodes, source=machine.source,
    )


def machines() -> list[tuple[str, Machine]]:
    big = load_machine("synthetic-72")
    return [("dgx1-v100 (8)", load_machine("dgx1-v100")),
            ("synthetic-72 GPUs 0-15 (16)", sub_machine(big, range(16), "synthetic-16")),
            ("synthetic-72 (72)", big)]


def speed_claims() -> list[Claim]:
    return [Claim(gpus=1), Claim(gpus=2), Claim(gpus=4), Claim(gpus=2, colocate=DomainKind.NVLINK),
            Claim(gpus=4, colocate=DomainKind.NVLINK, strategy=Strategy.SPREAD), Claim(memory_mib=4 * GIB),
            Claim(memory_mib=2 * GIB, compute_pct=10, strategy=Strategy.SPREAD),
            Claim(gpus=1, exclusive=DomainKind.PCIE), Claim(gpus=8)]


def with_live_groups(machine: Machine, count: int) -> Allocator:
    a = Allocator(machine)
    plain = [g.index for g in machine.gpus if not g.mig_enabled]
    half = plain[: max(1, len(plain) // 2)]
    for i in range(count):
        a.allocate(Claim(memory_mib=16, gpu_ids=(half[i % len(half)],)), [f"live-{i}"], "bench")
    return a


def time_decisions(a: Allocator, decisions: int) -> list[float]:
    claims = speed_claims()
    times = []
    for i in range(decisions):
        claim = claims[i % len(claims)]
        start = time.perf_counter()
        try:
            a.allocate(claim, ["probe"], "bench")
            placed = True
        except PlacementError:
            placed = False
        times.append(time.perf_counter() - start)
        if placed:
            a.release("probe")
    return times


def speed(decisions: int) -> None:
    print(f"{'machine':30} {'live':>5} {'decisions/s':>12} {'p50 ms':>8} {'p99 ms':>8}")
    for name, machine in machines():
        for live in (0, 100, 1000):
            a = with_live_groups(machine, live)
            time_decisions(a, len(speed_claims()) * 2)
            times = sorted(time_decisions(a, decisions))
            p50 = statistics.median(times) * 1000
            p99 = times[min(len(times) - 1, int(len(times) * 0.99))] * 1000
            print(f"{name:30} {live:>5} {len(times) / sum(times):>12.0f} {p50:>8.2f} {p99:>8.2f}")


class FirstFit:
    """Lowest free indices, no topology: what simple local allocators do."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.plain = [g.index for g in machine.gpus if not g.mig_enabled]
        self.memory = {g.index: g.memory_mib or 0 for g in machine.gpus}
        self.used_memory = {g: 0 for g in self.plain}
        self.used_compute = {g: 0 for g in self.plain}
        self.whole: set[int] = set()
        self.groups: dict[str, list[tuple[int, int, int]]] = {}

    def allocate(self, claim: Claim, gid: str) -> tuple[int, ...] | None:
        if claim.gpus is not None:
            free = [g for g in self.plain if g not in self.whole and not self.used_memory[g]
                    and not self.used_compute[g]]
            if len(free) < claim.gpus:
                return None
            chosen = free[: claim.gpus]
            self.whole |= set(chosen)
            self.groups[gid] = [(g, self.memory[g], 100) for g in chosen]
            return tuple(chosen)
        memory, compute = claim.memory_mib or 0, claim.compute_pct or 0
        for g in self.plain:
            if (g not in self.whole and self.used_memory[g] + memory <= self.memory[g]
                    and self.used_compute[g] + compute <= 100):
                self.used_memory[g] += memory
                self.used_compute[g] += compute
                self.groups[gid] = [(g, memory, compute)]
                return (g,)
        return None

    def release(self, gid: str) -> None:
        for g, memory, compute in self.groups.pop(gid):
            if compute == 100 and memory == self.memory[g]:
                self.whole.discard(g)
            else:
                self.used_memory[g] -= memory
                self.used_compute[g] -= compute


@dataclass
class Outcome:
    accepted: int = 0
    attempted: int = 0
    multi_scores: list[int] = field(default_factory=list)

    def mean_multi(self) -> float:
        return statistics.mean(self.multi_scores) if self.multi_scores else 0.0


def trace(seed: int, steps: int, gpus: int) -> list[tuple[int, Claim, int]]:
    """(step, claim, lifetime): a third whole single GPUs, a third multi-GPU, a third shares."""
    rng = random.Random(seed)
    out = []
    for step in range(steps):
        kind = rng.random()
        if kind < 0.33:
            claim = Claim(gpus=1)
        elif kind < 0.66:
            claim = Claim(gpus=rng.choice([2, 2, 4, 4, 8][: 5 if gpus >= 8 else 4]))
        else:
            claim = Claim(memory_mib=rng.choice([2, 4, 8, 10]) * GIB, compute_pct=rng.choice([None, 10, 25]))
        out.append((step, claim, rng.randint(2, gpus * 2)))
    return out


def replay(machine: Machine, events: list[tuple[int, Claim, int]], ours: bool) -> Outcome:
    outcome = Outcome()
    place: Callable[[Claim, str], tuple[int, ...] | None]
    release: Callable[[str], None]
    if ours:
        allocator = Allocator(machine)

        def place(claim: Claim, gid: str) -> tuple[int, ...] | None:
            try:
                return tuple(allocator.allocate(claim, [gid], "trace")[0].gpus)
            except PlacementError:
                return None

        release = allocator.release
    else:
        baseline = FirstFit(machine)
        place, release = baseline.allocate, baseline.release
    ends: dict[int, list[str]] = {}
    for step, claim, life in events:
        for gid in ends.pop(step, []):
            release(gid)
        gid = f"t{step}"
        outcome.attempted += 1
        gpus = place(claim, gid)
        if gpus is None:
            continue
        outcome.accepted += 1
        ends.setdefault(step + life, []).append(gid)
        if len(gpus) > 1:
            outcome.multi_scores.append(sum(machine.nvlinks(a, b) for a, b in combinations(gpus, 2)))
    return outcome


def packing(steps: int) -> None:
    print(f"\n{'machine':30} {'':10} {'accepted':>9} {'mean NVLink (multi)':>20}")
    for name, machine in machines():
        events = trace(seed=42, steps=steps, gpus=len(machine.gpus))
        ours = replay(machine, events, ours=True)
        base = replay(machine, events, ours=False)
        for label, o in (("allocator", ours), ("first-fit", base)):
            print(f"{name:30} {label:10} {o.accepted / o.attempted:>9.1%} {o.mean_multi():>20.2f}")
        rate = (ours.accepted / ours.attempted) / max(base.accepted / base.attempted, 1e-9)
        score = ours.mean_multi() / base.mean_multi() if base.mean_multi() else float("inf")
        print(f"{name:30} {'ratio':10} {rate:>9.2f} {score:>20.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer decisions and a shorter trace")
    args = parser.parse_args()
    speed(decisions=200 if args.quick else 1000)
    packing(steps=300 if args.quick else 2000)


if __name__ == "__main__":
    main()
