"""The naive baseline: first-fit over GPU capacities, then `subprocess.Popen`
with CUDA_VISIBLE_DEVICES, which is what a team writes before it has cgd.

Bookings live in a JSON file read, changed and atomically written back
without a lock (the "GPU lock file" of many shared boxes); a supervisor keeps its children
in memory and relaunches them when it starts. Both are as fast as it gets,
and both are unsafe in ways this module counts, in the same run as cgd:

- double booking: clients that book at the same moment read the same free
  GPU and both take it;
- orphans: a supervisor killed with -9 leaves its workers running, and the
  next one starts them again beside the old ones.

    python -m benchmarks.baselines [--quick]              # the safety comparison
    python -m benchmarks.baselines launch --state F --memory MIB -- CMD...
    python -m benchmarks.baselines supervise --jobs N --memory MIB -- CMD...
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from benchmarks.harness import (
    SLEEP,
    gpus_over_capacity,
    marked_processes,
    running_cgd,
    scratch,
    wait_for,
)
from benchmarks.report import Table
from tests.daemon_fixture import Cgd

GPUS = 8
GPU_MIB = 81559
"""The simulated dgx-h100 every comparison runs on: 8 GPUs of 81559 MiB."""

MARKER = "NAIVE_INSTANCE"
MEMORY_VAR = "NAIVE_MEMORY_MIB"


class Bookings:
    """name -> {"gpus": [...], "memory_mib": M}; M == GPU_MIB means whole GPUs."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, dict]:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}

    def allocate(self, name: str, gpus: int = 0, memory_mib: int = 0) -> list[int] | None:
        """First fit: the lowest GPUs with room, or None. No lock: that is the point."""
        books = self.read()
        chosen = first_fit(books, gpus, memory_mib)
        if chosen is None:
            return None
        books[name] = {"gpus": chosen, "memory_mib": GPU_MIB if gpus else memory_mib}
        self.write(books)
        return chosen

    def release(self, name: str) -> None:
        books = self.read()
        books.pop(name, None)
        self.write(books)

    def write(self, books: dict[str, dict]) -> None:
        """Atomic (write aside, rename) so a reader never sees half a file; still no lock,
        so two clients that read the same bookings each write back their own version."""
        aside = self.path.with_name(f"{self.path.name}.{os.getpid()}.{threading.get_ident()}")
        aside.write_text(json.dumps(books))
        os.replace(aside, self.path)


def first_fit(books: dict[str, dict], gpus: int, memory_mib: int) -> list[int] | None:
    used = [0] * GPUS
    for booking in books.values():
        for gpu in booking["gpus"]:
            used[gpu] += booking["memory_mib"]
    if gpus:
        free = [g for g in range(GPUS) if used[g] == 0]
        return free[:gpus] if len(free) >= gpus else None
    for gpu in range(GPUS):
        if used[gpu] + memory_mib <= GPU_MIB:
            return [gpu]
    return None


def launch(argv: Sequence[str], gpus: list[int], memory_mib: int, instance: str) -> subprocess.Popen:
    """The worker, detached as a service would be, with its GPUs in its environment."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(map(str, gpus)), CUDA_DEVICE_ORDER="PCI_BUS_ID")
    env[MARKER] = instance
    if memory_mib < GPU_MIB:
        env[MEMORY_VAR] = str(memory_mib)
    return subprocess.Popen(list(argv), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def supervise(jobs: int, memory_mib: int, argv: Sequence[str], instance: str) -> None:
    """Start `jobs` workers first-fit, say `ready`, relaunch any that exits.

    Its bookings are in memory only: killed, it forgets what it started.
    """
    books: dict[str, dict] = {}
    children: dict[str, subprocess.Popen] = {}
    for n in range(jobs):
        gpus = first_fit(books, 0, memory_mib)
        if gpus is None:
            break
        books[f"job{n}"] = {"gpus": gpus, "memory_mib": memory_mib}
        children[f"job{n}"] = launch(argv, gpus, memory_mib, instance)
    print("ready", flush=True)
    while True:
        for name, child in children.items():
            if child.poll() is not None:
                children[name] = launch(argv, books[name]["gpus"], memory_mib, instance)
        time.sleep(0.1)


# -- the safety comparison ------------------------------------------------------


def race(book: Callable[[int], bool], clients: int) -> list[bool]:
    """`clients` threads call `book(i)` at the same moment; True where it was granted."""
    barrier = threading.Barrier(clients)
    granted = [False] * clients

    def client(i: int) -> None:
        barrier.wait()
        granted[i] = book(i)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return granted


def double_booking(quick: bool) -> Table:
    """Twice as many clients as GPUs each ask for one whole GPU with a worker, all at once."""
    clients, rounds = 2 * GPUS, (3 if quick else 10)
    table = Table(f"Double booking: {clients} clients ask for 1 whole GPU each at once, {rounds} rounds, "
                  f"{GPUS} GPUs", ["system", "granted", "refused", "errors", "GPUs with 2+ workers"])
    naive, ours = [0, 0, 0, 0], [0, 0, 0, 0]
    with scratch("cg-naive-") as root:
        for r in range(rounds):
            _tally(naive, *naive_round(Bookings(root / f"books-{r}.json"), clients, str(root)))
    with running_cgd() as cgd:
        for r in range(rounds):
            _tally(ours, *cgd_round(cgd, clients, f"r{r}"))
    for system, (granted, refused, errors, doubled) in (("naive", naive), ("cgd", ours)):
        table.add(system, granted, refused, errors, doubled)
    table.note("GPUs with 2+ workers is read from /proc: the CUDA_VISIBLE_DEVICES of the live workers, "
               "after each round; a correct allocator grants 8 and refuses 8 per round.")
    table.note("naive: first-fit over a shared JSON bookings file, read and atomically rewritten without "
               "a lock, then subprocess.Popen.")
    return table


def naive_round(books: Bookings, clients: int, instance: str) -> tuple[list[bool], int, list[dict[str, str]]]:
    """(granted per client, errors, the live workers' environments)."""
    workers: list[subprocess.Popen] = []

    def book(i: int) -> bool:
        gpus = books.allocate(f"c{i}", gpus=1)
        if gpus is not None:
            workers.append(launch(SLEEP, gpus, GPU_MIB, instance))
        return gpus is not None

    granted = race(book, clients)
    live = list(marked_processes(MARKER, instance).values())
    reap(workers)
    return granted, 0, live


def cgd_round(cgd: Cgd, clients: int, prefix: str) -> tuple[list[bool], int, list[dict[str, str]]]:
    statuses = [0] * clients

    def book(i: int) -> bool:
        statuses[i], _ = cgd.request("POST", "/v1/components", {
            "name": f"{prefix}-c{i}", "claim": {"gpus": 1}, "command": list(SLEEP)})
        return statuses[i] == 201

    granted = race(book, clients)
    instance = str(cgd.state_dir.resolve())
    # A worker counts once its launch shim has exec'd into it with its environment.
    [live] = wait_for(lambda: at_least(marked_processes("CG_INSTANCE", instance), sum(granted)))
    for i, was in enumerate(granted):
        if was:
            cgd.request("DELETE", f"/v1/components/{prefix}-c{i}")
    return granted, sum(1 for s in statuses if s not in (201, 409)), list(live.values())


def at_least(found: dict[int, dict[str, str]], count: int) -> list[dict[int, dict[str, str]]] | None:
    """For `wait_for`: `[found]` (truthy even when empty) once it holds `count` processes."""
    return [found] if len(found) >= count else None


def reap(children: Iterable[subprocess.Popen]) -> None:
    """Kill and wait for our own children, so none is left as a zombie."""
    for child in children:
        child.kill()
        child.wait()


def _tally(total: list[int], granted: list[bool], errors: int, envs: list[dict[str, str]]) -> None:
    total[0] += sum(granted)
    total[1] += len(granted) - sum(granted) - errors
    total[2] += errors
    total[3] += gpus_over_capacity(envs, MEMORY_VAR, GPU_MIB)


def run(quick: bool = False) -> list[Table]:
    return [double_booking(quick)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action")
    parser.add_argument("--quick", action="store_true")
    one = sub.add_parser("launch", help="book first-fit and start one worker; print its pid")
    one.add_argument("--state", required=True)
    one.add_argument("--instance", required=True)
    one.add_argument("--memory", type=int, default=0, help="MiB of one GPU; 0 means one whole GPU")
    one.add_argument("command", nargs=argparse.REMAINDER)
    many = sub.add_parser("supervise", help="start JOBS workers, relaunch them when they exit")
    many.add_argument("--jobs", type=int, required=True)
    many.add_argument("--memory", type=int, required=True)
    many.add_argument("--instance", required=True)
    many.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = list(getattr(args, "command", []))
    if command[:1] == ["--"]:
        command = command[1:]
    if args.action == "launch":
        name = f"job-{os.getpid()}"
        gpus = Bookings(Path(args.state)).allocate(name, gpus=0 if args.memory else 1, memory_mib=args.memory)
        if gpus is None:
            sys.exit("naive: no GPU has room")
        print(launch(command, gpus, args.memory or GPU_MIB, args.instance).pid, flush=True)
    elif args.action == "supervise":
        supervise(args.jobs, args.memory, command, args.instance)
    else:
        from benchmarks.report import render_text

        for table in run(args.quick):
            print(render_text(table), end="\n\n")


if __name__ == "__main__":
    main()
