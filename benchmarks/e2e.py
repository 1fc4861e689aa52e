"""End to end through cgd's socket and through `cgctl`, against the naive baseline.

- API: allocate + release round trips per second and p50/p99 latency with
  1, 8 and 32 concurrent clients (threads, one connection per request as
  cgctl does), and the same load on the naive lock-free bookings file. After
  the load every allocation was released, so whatever is still booked was
  lost by a race.
- Worker: allocate + start a worker + release, until the worker runs with its
  environment (read in /proc), with a small state and with 1000 live groups,
  against first-fit + `subprocess.Popen`; the start also against the start of
  a bare interpreter, `python -I -S -c pass` (the launch shim is one).
- cgctl: `cgctl allocate NAME ... -- CMD` until the worker runs, against the
  naive launcher script; `cgctl --version` start-up against `python -c "import click"`.

    python -m benchmarks.e2e [--quick]
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from benchmarks.baselines import MARKER, Bookings, launch, reap
from benchmarks.harness import (
    SLEEP,
    compile_bytecode,
    kill_all,
    marked_processes,
    ok,
    running_cgd,
    scratch,
    wait_for,
    worker_running,
)
from benchmarks.report import Table, mean, ms, percentile, ratio, run_standalone
from tests.daemon_fixture import Cgd, _executable

CLIENTS = (1, 8, 32)
SHARE_MIB = 1024
LIVE_GROUPS = 1000
START_POLL_S = 0.0002
"""How often /proc is read while a worker starts: a start takes a few milliseconds."""


@dataclass
class Load:
    """What `clients` threads did in `elapsed` seconds."""

    clients: int
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    leftovers: int = 0

    @property
    def per_second(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0


def drive(op: Callable[[int, int], float | None], clients: int, duration: float) -> Load:
    """Every client calls `op(client, n)` back to back until the deadline;
    `op` returns one round trip's latency, or None when it failed."""
    load = Load(clients)
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)
    deadline = [0.0]

    def client(c: int) -> None:
        barrier.wait()
        n = 0
        while time.perf_counter() < deadline[0]:
            latency = op(c, n)
            n += 1
            with lock:
                if latency is None:
                    load.errors += 1
                else:
                    load.latencies.append(latency)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    start = time.perf_counter()
    deadline[0] = start + duration
    barrier.wait()
    for t in threads:
        t.join()
    load.elapsed = time.perf_counter() - start
    return load


def cgd_round_trip(cgd: Cgd) -> Callable[[int, int], float | None]:
    def op(c: int, n: int) -> float | None:
        name = f"t{c}-{n}"
        start = time.perf_counter()
        created, _ = cgd.request("POST", "/v1/components", {"name": name, "claim": {"memory_mib": SHARE_MIB}})
        released, _ = cgd.request("DELETE", f"/v1/components/{name}")
        latency = time.perf_counter() - start
        return latency if (created, released) == (201, 200) else None
    return op


def naive_round_trip(books: Bookings) -> Callable[[int, int], float | None]:
    def op(c: int, n: int) -> float | None:
        name = f"t{c}-{n}"
        start = time.perf_counter()
        if books.allocate(name, memory_mib=SHARE_MIB) is None:
            return None
        books.release(name)
        return time.perf_counter() - start
    return op


def api(quick: bool) -> list[Table]:
    duration = 1.5 if quick else 5.0
    table = Table("API: allocate + release round trips (1 GiB share of one GPU)",
                  ["system", "clients", "round trips", "per s", "p50 ms", "p99 ms", "errors",
                   "lost bookings", "per s vs naive", "per s vs 1 client"])
    naive: dict[int, Load] = {}
    with scratch("cg-naive-") as root:
        for clients in CLIENTS:
            books = Bookings(root / f"books-{clients}.json")
            naive[clients] = drive(naive_round_trip(books), clients, duration)
            naive[clients].leftovers = len(books.read())
    scale = Table("API at scale: one client's allocate + release round trip, with 10 and with "
                  f"{LIVE_GROUPS} live groups",
                  ["live groups", "round trips", "per s", "p50 ms", "p99 ms", "p50 vs 10 groups"])
    with running_cgd() as cgd:
        drive(cgd_round_trip(cgd), 1, 0.3)
        measured: dict[int, Load] = {}
        for clients in CLIENTS:
            load = measured[clients] = drive(cgd_round_trip(cgd), clients, duration)
            load.leftovers = len(ok(cgd, "GET", "/v1/groups")["groups"])
            _load_row(table, "cgd", load, ratio(load.per_second, naive[clients].per_second),
                      ratio(load.per_second, measured[1].per_second))
        by_size: dict[int, Load] = {}
        held = 0
        for live in (10, LIVE_GROUPS):
            _live_groups(cgd, live - held, first=held)
            held = live
            by_size[live] = drive(cgd_round_trip(cgd), 1, duration)
        small = percentile(by_size[10].latencies, 50)
        for live, load in by_size.items():
            scale.add(live, len(load.latencies), load.per_second, ms(percentile(load.latencies, 50)),
                      ms(percentile(load.latencies, 99)), ratio(percentile(load.latencies, 50), small))
    for clients in CLIENTS:
        _load_row(table, "naive", naive[clients], "1.00x", ratio(naive[clients].per_second, naive[1].per_second))
    table.note(f"{duration:g} s per row. cgd: one HTTP request per connection on its Unix socket, each "
               "allocation and each release a durable (fsync'd) state commit; a reply waits for its fsync, "
               "which requests committed meanwhile share (group commit). The clients share this machine's "
               "cores with cgd.")
    table.note("naive: first-fit over a JSON file read and atomically rewritten (no lock, no fsync); "
               "lost bookings are entries still booked after every client released its own: updates one "
               "client overwrote with another's. Each such entry is capacity nobody can use again.")
    scale.note("live groups: components holding a 64 MiB share each and running nothing, allocated "
               "before the row. A commit appends what changed to the journal, so its cost should not "
               "grow with them.")
    return [table, scale]


def _load_row(table: Table, system: str, load: Load, vs: str, vs_one: str) -> None:
    table.add(system, load.clients, len(load.latencies), load.per_second, ms(percentile(load.latencies, 50)),
              ms(percentile(load.latencies, 99)), load.errors, load.leftovers, vs, vs_one)


def worker_cycle(quick: bool) -> Table:
    """One client: allocate, start a worker, see it run with its GPUs, release it."""
    reps = 10 if quick else 40
    table = Table("Allocate + start a worker + release (until the worker runs with its environment)",
                  ["system", "live groups", "samples", "start p50 ms", "start p99 ms", "start vs python -I -S",
                   "cycle p50 ms", "cycle p99 ms", "cycle vs naive"])
    floor = _times(lambda: _quiet([sys.executable, "-I", "-S", "-c", "pass"]), reps)
    naive_start, naive_cycle = _naive_cycles(reps)
    with running_cgd() as cgd:
        measured = {0: _cgd_cycles(cgd, reps, "small")}
        _live_groups(cgd, LIVE_GROUPS)
        measured[LIVE_GROUPS] = _cgd_cycles(cgd, reps, "large")
    for live, (start, cycle) in measured.items():
        table.add("cgd", live, len(cycle), ms(percentile(start, 50)), ms(percentile(start, 99)),
                  ratio(percentile(start, 50), percentile(floor, 50)), ms(percentile(cycle, 50)),
                  ms(percentile(cycle, 99)), ratio(percentile(cycle, 50), percentile(naive_cycle, 50)))
    table.add("naive", 0, len(naive_cycle), ms(percentile(naive_start, 50)), ms(percentile(naive_start, 99)),
              ratio(percentile(naive_start, 50), percentile(floor, 50)), ms(percentile(naive_cycle, 50)),
              ms(percentile(naive_cycle, 99)), "1.00x")
    table.add("python -I -S -c pass", None, len(floor), ms(percentile(floor, 50)), ms(percentile(floor, 99)),
              "1.00x", None, None, "-")
    table.note("The worker is `sleep`, so what is timed is the manager, not the worker. cgd's start is "
               "request to reply (the allocation's commit, the spawn through circus, the commit of the "
               "worker's pid) and then until /proc shows the worker exec'd with its environment: the launch "
               "shim (a compiled stdlib-only script run by `python -I -S`) joins the worker's cgroup, opens "
               "its logs, forks the worker with privileges dropped and stays as its parent to record how it "
               "ends. Its release stops the worker (SIGTERM, wait) and commits again.")
    table.note(f"live groups: {LIVE_GROUPS} components holding a 64 MiB share each, allocated before the "
               "second cgd row; the state commits grow with them. `python -I -S -c pass`: a bare "
               "interpreter run to its end by subprocess, measured in the same run.")
    return table


def _naive_cycles(reps: int) -> tuple[list[float], list[float]]:
    start, cycle = [], []
    with scratch("cg-naive-") as root:
        books = Bookings(root / "books.json")
        for n in range(reps):
            begin = time.perf_counter()
            gpus = books.allocate(f"w{n}", memory_mib=SHARE_MIB)
            assert gpus is not None
            child = launch(SLEEP, gpus, SHARE_MIB, str(root))
            wait_for(partial(worker_running, child.pid, MARKER), interval=START_POLL_S)
            start.append(time.perf_counter() - begin)
            reap([child])
            books.release(f"w{n}")
            cycle.append(time.perf_counter() - begin)
    return start, cycle


def _cgd_cycles(cgd: Cgd, reps: int, prefix: str) -> tuple[list[float], list[float]]:
    start, cycle = [], []
    for n in range(reps):
        name = f"{prefix}{n}"
        begin = time.perf_counter()
        reply = ok(cgd, "POST", "/v1/components", {"name": name, "claim": {"memory_mib": SHARE_MIB},
                                                    "command": list(SLEEP)}, expect=201)
        pid = reply["replicas"][0]["pids"][0]
        wait_for(partial(worker_running, pid), interval=START_POLL_S)
        start.append(time.perf_counter() - begin)
        ok(cgd, "DELETE", f"/v1/components/{name}")
        cycle.append(time.perf_counter() - begin)
    return start, cycle


def _live_groups(cgd: Cgd, count: int, first: int = 0) -> None:
    """`count` more groups in the state: components that hold a small share and run nothing."""
    for n in range(first, first + count):
        ok(cgd, "POST", "/v1/components", {"name": f"live{n}", "claim": {"memory_mib": 64}}, expect=201)


def cli(quick: bool) -> Table:
    reps = 5 if quick else 20
    table = Table("cgctl: start-up, and `cgctl allocate NAME --memory 1GiB -- CMD` until the worker runs",
                  ["command", "samples", "p50 ms", "p99 ms", "vs baseline", "baseline"])
    cgctl = _executable("cgctl")
    compile_bytecode()
    floor = _times(lambda: _quiet([sys.executable, "-c", "pass"]), reps)
    click_floor = _times(lambda: _quiet([sys.executable, "-c", "import click"]), reps)
    version = _times(lambda: _quiet([cgctl, "--version"]), reps)
    helped = _times(lambda: _quiet([cgctl, "--help"]), reps)
    for what, times in (("cgctl --version", version), ("cgctl --help", helped)):
        table.add(what, reps, ms(percentile(times, 50)), ms(percentile(times, 99)),
                  ratio(percentile(times, 50), percentile(click_floor, 50)), "python -c 'import click'")
    table.add("python -c 'import click'", reps, ms(percentile(click_floor, 50)), ms(percentile(click_floor, 99)),
              ratio(percentile(click_floor, 50), percentile(floor, 50)), "python -c pass")
    table.add("python -c pass", reps, ms(percentile(floor, 50)), ms(percentile(floor, 99)), "1.00x", "")
    naive: list[float] = []
    with scratch("cg-naive-") as root:
        launcher = [sys.executable, "-m", "benchmarks.baselines", "launch", "--state", str(root / "books.json"),
                    "--instance", str(root), "--memory", str(SHARE_MIB), "--", *SLEEP]
        try:
            for _ in range(reps):
                begin = time.perf_counter()
                pid = int(subprocess.run(launcher, capture_output=True, text=True, check=True,
                                         cwd=Path(__file__).resolve().parent.parent).stdout)
                wait_for(partial(worker_running, pid, MARKER), interval=START_POLL_S)
                naive.append(time.perf_counter() - begin)
        finally:
            kill_all(marked_processes(MARKER, str(root)))
    ours: list[float] = []
    listing: list[float] = []
    with running_cgd() as cgd:
        for n in range(reps):
            begin = time.perf_counter()
            done = cgd.cgctl("--json", "allocate", f"c{n}", "--memory", "1GiB", "--", *SLEEP)
            if done.returncode != 0:
                raise RuntimeError(f"cgctl allocate failed: {done.stderr}")
            pid = json.loads(done.stdout)["replicas"][0]["pids"][0]
            wait_for(partial(worker_running, pid), interval=START_POLL_S)
            ours.append(time.perf_counter() - begin)
        listing = _times(lambda: cgd.cgctl("list").check_returncode(), reps)
    table.add("cgctl allocate ... -- sleep", reps, ms(percentile(ours, 50)), ms(percentile(ours, 99)),
              ratio(percentile(ours, 50), percentile(naive, 50)), "naive launcher")
    table.add("naive launcher -- sleep", reps, ms(percentile(naive, 50)), ms(percentile(naive, 99)), "1.00x", "")
    table.add(f"cgctl list ({reps} components)", reps, ms(percentile(listing, 50)), ms(percentile(listing, 99)),
              ratio(percentile(listing, 50), percentile(click_floor, 50)), "python -c 'import click'")
    table.note("naive launcher: `python -m benchmarks.baselines launch`, first-fit on a bookings file then "
               "Popen, a script of the same size as cgctl's work; both are timed until the worker process "
               "has its CUDA_VISIBLE_DEVICES in /proc.")
    table.note("The project's modules are compiled to bytecode first, as installing them compiles them: "
               "an editable install under PYTHONDONTWRITEBYTECODE would compile cgctl's modules (and the "
               "launcher's) from source on every run.")
    table.note(f"mean cgctl allocate {ms(mean(ours)):.1f} ms, of which start-up about "
               f"{ms(percentile(version, 50)):.1f} ms.")
    return table


def _quiet(argv: list[str]) -> None:
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)


def _times(action: Callable[[], object], reps: int) -> list[float]:
    action()
    times = []
    for _ in range(reps):
        begin = time.perf_counter()
        action()
        times.append(time.perf_counter() - begin)
    return times


def run(quick: bool = False) -> list[Table]:
    return [*api(quick), worker_cycle(quick), cli(quick)]


def main() -> None:
    run_standalone(__doc__, run)


if __name__ == "__main__":
    main()
