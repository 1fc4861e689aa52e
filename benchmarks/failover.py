"""Shadow promotion against a cold restart of the same worker.

The worker "loads" for 2 s (a model into GPU memory, in real life) before it
can serve. With a shadow, a warm standby on the same GPUs, the primary's
death costs only the promotion: cgd sees the exit through a pidfd, rewrites
the role file and signals the shadow. Without one, cgd restarts the worker
(with no back-off, its best case) and the service waits for the load again.

Both are timed from the SIGKILL of the serving process to the moment a
process says it serves: the shadow's signal handler, the fresh worker's end
of loading. Workers write `time.monotonic()` (one clock for every process on
Linux) to an events file.

    python -m benchmarks.failover [--quick]
"""

from __future__ import annotations

import os
import signal
import sys
import time
from functools import partial
from pathlib import Path

from benchmarks.harness import ok, running_cgd, wait_for
from benchmarks.report import Table, ms, percentile, ratio, run_standalone
from tests.daemon_fixture import Cgd

LOAD_S = 2.0
WORKER = """\
import os, signal, time
events = os.environ["BENCH_EVENTS"]
def note(what):
    with open(events, "a") as f:
        f.write(f"{what} {os.getpid()} {time.monotonic()}\\n")
signal.signal(signal.SIGUSR1, lambda *_: note("serving"))
time.sleep(float(os.environ["BENCH_LOAD_S"]))
note("loaded")
if os.environ.get("CG_ROLE") == "primary":
    note("serving")
while True:
    time.sleep(3600)
"""


def events(path: Path) -> list[tuple[str, int, float]]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [(what, int(pid), float(at)) for what, pid, at in (line.split() for line in lines if line.count(" ") == 2)]


def event_after(path: Path, what: str, since: float, pid: int | None = None) -> float | None:
    """When `what` was first noted after `since` (by `pid` if given)."""
    for seen, by, at in events(path):
        if seen == what and at >= since and (pid is None or by == pid):
            return at
    return None


def body(name: str, events_file: Path, **extra: object) -> dict:
    return {"name": name, "command": [sys.executable, "-c", WORKER],
            "env": {"BENCH_EVENTS": str(events_file), "BENCH_LOAD_S": str(LOAD_S)},
            "restart": {"max_retries": 100, "backoff_s": 0}, **extra}


def serving_pid(cgd: Cgd, names: tuple[str, ...]) -> tuple[int, int]:
    """(primary pid, shadow pid) of replica 0 across a primary and its shadow."""
    roles = {}
    for name in names:
        replica = ok(cgd, "GET", f"/v1/components/{name}")["replicas"][0]
        if replica["pids"]:
            roles[replica["role"]] = replica["pids"][0]
    if set(roles) != {"primary", "shadow"}:
        raise RuntimeError(f"expected a primary and a shadow, got {roles}")
    return roles["primary"], roles["shadow"]


def promotions(cgd: Cgd, events_file: Path, reps: int) -> list[float]:
    ok(cgd, "POST", "/v1/components", body("web", events_file, claim={"gpus": 1}), expect=201)
    ok(cgd, "POST", "/v1/components", body("web-standby", events_file, shadow_of="web"), expect=201)
    times = []
    for _ in range(reps):
        primary, shadow = wait_for(lambda: _both_loaded(cgd, events_file), timeout=LOAD_S * 5)
        killed = time.monotonic()
        os.kill(primary, signal.SIGKILL)
        served = wait_for(partial(event_after, events_file, "serving", killed, shadow), timeout=10)
        times.append(served - killed)
    return times


def _both_loaded(cgd: Cgd, events_file: Path) -> tuple[int, int] | None:
    """The pair, once both processes have loaded (the dead one comes back as a shadow)."""
    try:
        primary, shadow = serving_pid(cgd, ("web", "web-standby"))
    except RuntimeError:
        return None
    loaded = {pid for what, pid, _ in events(events_file) if what == "loaded"}
    return (primary, shadow) if {primary, shadow} <= loaded else None


def cold_restarts(cgd: Cgd, events_file: Path, reps: int) -> list[float]:
    ok(cgd, "POST", "/v1/components", body("cold", events_file, claim={"gpus": 1}), expect=201)
    times = []
    for _ in range(reps):
        pid = wait_for(lambda: _loaded_pid(cgd, events_file), timeout=LOAD_S * 5)
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        served = wait_for(partial(event_after, events_file, "serving", killed), timeout=LOAD_S * 5)
        times.append(served - killed)
    return times


def _loaded_pid(cgd: Cgd, events_file: Path) -> int | None:
    pids = ok(cgd, "GET", "/v1/components/cold")["replicas"][0]["pids"]
    loaded = {pid for what, pid, _ in events(events_file) if what == "loaded"}
    return pids[0] if pids and pids[0] in loaded else None


def run(quick: bool = False) -> list[Table]:
    reps = 2 if quick else 5
    table = Table(f"Failover: a worker that loads for {LOAD_S:g} s, killed with SIGKILL, until it serves again",
                  ["how", "samples", "p50 ms", "max ms", "faster than cold restart"])
    with running_cgd() as cgd:
        promoted = promotions(cgd, cgd.root / "shadow.events", reps)
        cold = cold_restarts(cgd, cgd.root / "cold.events", reps)
    table.add("shadow promotion", reps, ms(percentile(promoted, 50)), ms(max(promoted)),
              ratio(percentile(cold, 50), percentile(promoted, 50)))
    table.add("cold restart (no back-off)", reps, ms(percentile(cold, 50)), ms(max(cold)), "1.00x")
    table.note("Promotion: cgd sees the primary's exit (pidfd), swaps the roles in its state (one durable "
               "commit), rewrites the role file and sends SIGUSR1 to the shadow; timed until the shadow's "
               "handler runs. The dead primary then comes back as the new shadow and loads in the background.")
    table.note("Cold restart: the same worker under cgd's restart policy with backoff_s = 0 (the default "
               "1 s back-off would add a second); timed until the new process has loaded.")
    return [table]


def main() -> None:
    run_standalone(__doc__, run)


if __name__ == "__main__":
    main()
