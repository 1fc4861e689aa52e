"""Recovery after `kill -9` of the manager with 100 live workers, and its idle cost.

cgd is killed with SIGKILL while 100 components run (a 5 GiB share each, a
`sleep` worker each) and started again on the same state: timed from the new
process's start until it answers on its socket (it adopts the workers before
it listens). Then, from /proc: how many workers have another pid than before
(restarted: goal 0), how many live processes of this instance no replica
owns (orphans: goal 0), and how many GPUs the live processes overfill by
their own CUDA_VISIBLE_DEVICES and shares.

The naive supervisor goes through the same: killed with -9, started again,
timed until it says it has launched its jobs.

Idle cost: RSS and CPU of cgd doing nothing (its health loop samples every
2 s) with 0 and 100 components, beside the naive supervisor's.

    python -m benchmarks.recovery [--quick]
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from benchmarks.baselines import GPU_MIB, MARKER, MEMORY_VAR
from benchmarks.harness import (
    SLEEP,
    compile_bytecode,
    cpu_seconds,
    gpus_over_capacity,
    idle_cost,
    kill_all,
    marked_processes,
    ok,
    replica_pids,
    running_cgd,
    scratch,
    timed_start,
    wait_for,
    worker_running,
)
from benchmarks.report import Table, ms, percentile, ratio, run_standalone
from tests.daemon_fixture import Cgd

COMPONENTS = 100
SHARE_MIB = 5 * 1024
REPO = Path(__file__).resolve().parent.parent


def answer_cpu(cgd: Cgd) -> float:
    """The CPU time cgd spent until it answered (read just after): on a machine shared with other
    work, the wall time until it answers also counts the time it waited for a core."""
    assert cgd.proc is not None
    return cpu_seconds(cgd.proc.pid)


def populate(cgd: Cgd, count: int) -> None:
    for n in range(count):
        reply = ok(cgd, "POST", "/v1/components", {"name": f"svc{n:03d}", "claim": {"memory_mib": SHARE_MIB},
                                                    "command": list(SLEEP)}, expect=201)
        pid = reply["replicas"][0]["pids"][0]
        wait_for(partial(worker_running, pid), timeout=10)


def cgd_crashes(cgd: Cgd, reps: int) -> dict[str, list[float]]:
    """Kill -9 and start again `reps` times; what each recovery kept and broke."""
    out: dict[str, list[float]] = {"answer": [], "cpu": [], "restarted": [], "orphans": [], "over": []}
    instance = str(cgd.state_dir.resolve())
    for _ in range(reps):
        before = replica_pids(cgd)
        cgd.kill9()
        out["answer"].append(timed_start(cgd))
        out["cpu"].append(answer_cpu(cgd))
        after = replica_pids(cgd)
        owned = {pid for pids in after.values() for pid in pids}
        live = marked_processes("CG_INSTANCE", instance)
        out["restarted"].append(sum(1 for ref, pids in before.items() if after.get(ref) != pids))
        out["orphans"].append(len(set(live) - owned))
        out["over"].append(gpus_over_capacity(live.values(), "CG_GPU_MEMORY_MIB", GPU_MIB))
    return out


@contextmanager
def naive_supervisor(instance: str) -> Iterator[subprocess.Popen]:
    """The naive supervisor with COMPONENTS jobs, once it says `ready`."""
    argv = [sys.executable, "-m", "benchmarks.baselines", "supervise", "--jobs", str(COMPONENTS),
            "--memory", str(SHARE_MIB), "--instance", instance, "--", *SLEEP]
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the naive supervisor did not start")
        yield proc
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def naive_crashes(reps: int, window_s: float) -> tuple[dict[str, list[float]], tuple[float, float]]:
    out: dict[str, list[float]] = {"answer": [], "cpu": [], "restarted": [], "orphans": [], "over": []}
    idle: tuple[float, float] | None = None
    with scratch("cg-naive-") as root:
        instance = str(root)
        try:
            for rep in range(reps):
                with naive_supervisor(instance) as first:
                    if rep == 0:
                        idle = idle_cost(first.pid, window_s)
                    before = set(marked_processes(MARKER, instance))
                    first.kill()
                    first.wait()
                    begin = time.perf_counter()
                    with naive_supervisor(instance) as again:
                        out["answer"].append(time.perf_counter() - begin)
                        out["cpu"].append(cpu_seconds(again.pid))
                        live = marked_processes(MARKER, instance)
                        out["restarted"].append(len(set(live) - before))
                        out["orphans"].append(len(before & set(live)))
                        out["over"].append(gpus_over_capacity(live.values(), MEMORY_VAR, GPU_MIB))
                kill_all(marked_processes(MARKER, instance))
        finally:
            kill_all(marked_processes(MARKER, instance))
    if idle is None:
        raise ValueError("the naive supervisor's idle cost needs at least one repetition")
    return out, idle


def run(quick: bool = False) -> list[Table]:
    reps, window_s = (1, 3.0) if quick else (3, 10.0)
    crash = Table(f"Recovery after kill -9 of the manager with {COMPONENTS} live workers (worst of {reps})",
                  ["system", "live workers", "answers again p50 ms", "max ms", "CPU until then p50 ms",
                   "workers restarted", "orphans", "GPUs over capacity"])
    idle = Table(f"Idle cost ({window_s:g} s window)", ["process", "components", "RSS MiB", "CPU % of a core"])
    compile_bytecode()  # else, run alone after an edit, cgd's start-up would count compiling the edited modules
    with running_cgd() as cgd:
        cgd.kill9()
        empty = timed_start(cgd)
        empty_cpu = answer_cpu(cgd)
        assert cgd.proc is not None
        idle.add("cgd", 0, *idle_cost(cgd.proc.pid, window_s))
        populate(cgd, COMPONENTS)
        idle.add("cgd", COMPONENTS, *idle_cost(cgd.proc.pid, window_s))
        ours = cgd_crashes(cgd, reps)
    theirs, naive_idle = naive_crashes(reps, window_s)
    idle.add("naive supervisor", COMPONENTS, *naive_idle)
    crash.add("cgd, empty state", 0, ms(empty), ms(empty), ms(empty_cpu), 0, 0, 0)
    for system, got in (("cgd", ours), ("naive supervisor", theirs)):
        crash.add(system, COMPONENTS, ms(percentile(got["answer"], 50)), ms(max(got["answer"])),
                  ms(percentile(got["cpu"], 50)),
                  int(max(got["restarted"])), int(max(got["orphans"])), int(max(got["over"])))
    crash.note(f"Each worker holds a {SHARE_MIB // 1024} GiB share; {COMPONENTS} of them fill 7 of the 8 "
               "simulated 80 GiB GPUs. Restarted, orphans and GPUs over capacity are the worst crash, read "
               "from /proc after the manager answers again.")
    crash.note("cgd adopts the running workers (same pid and start time) before it listens; the naive "
               "supervisor keeps its children in memory, so after the crash it starts them all again beside "
               "the old ones, which keep their GPU memory.")
    crash.note(f"cgd with {COMPONENTS} components answers "
               f"{ratio(percentile(ours['answer'], 50), empty)} as late as with none, having used "
               f"{ratio(percentile(ours['cpu'], 50), empty_cpu)} its CPU time. CPU until then: cgd's own "
               "(/proc/PID/stat, 10 ms ticks), read as it answers; it does not count the time it waited for "
               "a core, which the wall time does on a shared machine.")
    idle.note("CPU: the run time the kernel counts for each thread of the process, in nanoseconds "
              "(/proc/PID/task/TID/schedstat), over the window.")
    return [crash, idle]


def main() -> None:
    run_standalone(__doc__, run)


if __name__ == "__main__":
    main()
