"""The wait queue against a client that retries, on a seeded trace of jobs.

60 jobs of 1 to 8 GPUs, running 0.2 to 2 s each (`sleep`), each with a time
limit, all submitted at once to a simulated 8-GPU box. Two ways to run them:

- queue: each job is submitted once with `"wait": true, "detach": true`
  and cgd places it when its turn comes (priority, then first come first
  served, with backfill by time limits);
- retry: a client offers every job not yet started to cgd every 0.1 s,
  in submission order, without the queue, as scripts on a shared box do.

Both are compared with the ideal bound: every GPU busy all the time, a
makespan of GPU-seconds / 8. Start and end times are cgd's own (a
component's `created` is when it was placed, `ended_at` when its last
replica ended); the GPUs free at each moment are counted from them.

The queue's promise is checked on the same spans: no GPU idle while a job
that fits waits, unless starting it would delay the head of the queue
(the first job still waiting). Starting a job delays the head unless it is
the head, or it ends by its time limit before the head could start (the
running jobs let go at their limits, soonest first, until the head fits).
"""

from __future__ import annotations

import itertools
import math
import random
import time
from dataclasses import dataclass
from typing import Any

from benchmarks.harness import running_cgd
from benchmarks.report import Table, run_standalone
from tests.daemon_fixture import Cgd

GPUS = 8
SIZES = (1, 1, 1, 2, 2, 2, 4, 4, 8)
"""Job sizes drawn with these weights: mostly small jobs, some that need the whole box."""


@dataclass(frozen=True)
class Job:
    name: str
    gpus: int
    seconds: float

    @property
    def limit(self) -> float:
        """A time limit as users give one: the expected run with some margin."""
        return round(self.seconds * 1.5 + 0.5, 2)

    def body(self, queued: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"name": self.name, "claim": {"gpus": self.gpus}, "time_limit_s": self.limit,
                                "command": ["sleep", f"{self.seconds:.2f}"]}
        if queued:
            body.update(wait=True, detach=True)
        return body


def trace(count: int, seed: int = 7) -> list[Job]:
    rng = random.Random(seed)
    return [Job(f"job-{i:02d}", rng.choice(SIZES), round(rng.uniform(0.2, 2.0), 2)) for i in range(count)]


def run_queue(cgd: Cgd, jobs: list[Job]) -> float:
    start = time.time()
    for job in jobs:
        status, reply = cgd.request("POST", "/v1/components", job.body(queued=True))
        assert status == 201, reply
    _wait_all(cgd, jobs)
    return start


def run_retry(cgd: Cgd, jobs: list[Job]) -> float:
    start = time.time()
    waiting = list(jobs)
    while waiting:
        for job in list(waiting):
            status, reply = cgd.request("POST", "/v1/components", job.body(queued=False))
            if status == 201:
                waiting.remove(job)
            elif status != 409:
                raise AssertionError(reply)
        time.sleep(0.1)
    _wait_all(cgd, jobs)
    return start


def _wait_all(cgd: Cgd, jobs: list[Job]) -> None:
    for job in jobs:
        status, reply = cgd.request("GET", f"/v1/components/{job.name}/wait?until=ended&timeout=120", timeout=130)
        assert status == 200 and reply["reached"], reply


def measure(cgd: Cgd, jobs: list[Job], submitted: float) -> dict[str, Any]:
    _, listed = cgd.request("GET", "/v1/components")
    by_name = {c["name"]: c for c in listed["components"]}
    spans = [(by_name[j.name]["created"], by_name[j.name]["ended_at"], j.gpus) for j in jobs]
    assert all(by_name[j.name]["state"] == "completed" for j in jobs), "every job completes"
    end = max(e for _, e, _ in spans)
    busy = sum((e - s) * n for s, e, n in spans)
    waits = [s - submitted for s, _, _ in spans]
    return {"makespan": end - submitted, "utilisation": busy / (GPUS * (end - submitted)),
            "mean_wait": sum(waits) / len(waits), "max_wait": max(waits),
            "head_blocked": _head_blocked(jobs, spans), "idle_fitting": _idle_while_one_fitted(jobs, spans)}


def _head_blocked(jobs: list[Job], spans: list[tuple[float, float, int]]) -> float:
    """Seconds during which the first job still waiting fitted in the free GPUs and did not start."""
    events = sorted({t for s, e, _ in spans for t in (s, e)})
    blocked = 0.0
    for t0, t1 in itertools.pairwise(events):
        mid = (t0 + t1) / 2
        used = sum(n for s, e, n in spans if s <= mid < e)
        waiting = [j for j, (s, _, _) in zip(jobs, spans, strict=True) if s > mid]
        if waiting and waiting[0].gpus <= GPUS - used:
            blocked += t1 - t0
    return blocked


def _idle_while_one_fitted(jobs: list[Job], spans: list[tuple[float, float, int]]) -> tuple[float, int]:
    """Seconds, and stretches, during which GPUs were idle while a waiting job fitted in them and
    starting it would not have delayed the head (see the module's docstring)."""
    events = sorted({t for s, e, _ in spans for t in (s, e)})
    idle, stretches, before = 0.0, 0, False
    for t0, t1 in itertools.pairwise(events):
        mid = (t0 + t1) / 2
        running = [(s, j) for j, (s, e, _) in zip(jobs, spans, strict=True) if s <= mid < e]
        free = GPUS - sum(j.gpus for _, j in running)
        waiting = [j for j, (s, _, _) in zip(jobs, spans, strict=True) if s > mid]
        now = waiting and free > 0 and _could_start(waiting, free, running, mid)
        if now:
            idle += t1 - t0
            stretches += not before
        before = bool(now)
    return idle, stretches


def _could_start(waiting: list[Job], free: int, running: list[tuple[float, Job]], now: float) -> bool:
    head = waiting[0]
    head_at = now if head.gpus <= free else math.inf
    freed = free
    for end, gpus in sorted((s + j.limit, j.gpus) for s, j in running):
        if head_at < math.inf:
            break
        freed += gpus
        if freed >= head.gpus:
            head_at = max(end, now)
    return any(j.gpus <= free and (j is head or now + j.limit <= head_at) for j in waiting)


def run(quick: bool = False) -> list[Table]:
    jobs = trace(20 if quick else 60)
    ideal = sum(j.gpus * j.seconds for j in jobs) / GPUS
    table = Table(
        f"Wait queue: {len(jobs)} jobs of 1-8 GPUs, 0.2-2 s each, on a simulated 8-GPU box",
        ["client", "makespan s", "vs ideal", "GPU utilisation", "mean wait s", "max wait s",
         "head fitted but waited s", "GPUs idle while a job fitted s (stretches)"])
    for name, runner in (("queue (--wait --detach)", run_queue), ("retry every 0.1 s", run_retry)):
        with running_cgd("dgx-h100") as cgd:
            figures = measure(cgd, jobs, runner(cgd, jobs))
        idle, stretches = figures["idle_fitting"]
        table.add(name, round(figures["makespan"], 2), f"{figures['makespan'] / ideal:.2f}x",
                  f"{figures['utilisation']:.0%}", round(figures["mean_wait"], 2), round(figures["max_wait"], 2),
                  round(figures["head_blocked"], 2), f"{idle:.3f} ({stretches})")
    table.add("ideal bound", round(ideal, 2), "1.00x", "100%", "", "", "", "")
    table.note("ideal: GPU-seconds of the trace / 8 GPUs, as if every GPU were busy from the first moment "
               "to the last; no schedule can beat it.")
    table.note("head fitted but waited: time during which the first job in submission order still waiting "
               "would have fitted in the free GPUs; with the queue, only while a backfilled job "
               "(ending before the head could start) or cgd's own latency held it.")
    table.note("GPUs idle while a job fitted: time during which some GPUs were free and a waiting job fitted "
               "in them without delaying the head (it is the head, or by its time limit it ends before "
               "the head could start): the queue's promise is that this is only cgd's latency between "
               "one job's end and the next one's start (milliseconds per stretch).")
    return [table]


if __name__ == "__main__":
    run_standalone(__doc__, run)
