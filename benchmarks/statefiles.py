"""Time per durable state commit, against the floor of one fsync'd append of the same journal line.

A commit does more than append: it takes the lock, checks the files are as
it left them, finds what changed, validates the changed records and appends
them as one checksummed line, fsync'd. The ratio to the floor (the same
line appended once and fsync'd, in the same directory, interleaved with the
commits so both see the same disk) says what that safety costs on this disk,
and it should not grow with the state; every 1000th commit also writes a
snapshot of the whole document, timed separately. The store holds its file
lock between commits, as cgd's does (`StateStore.hold`); commits that take
and drop the lock each time, as a writer without cgd would, are timed after.

    python -m benchmarks.statefiles [--quick] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Run as a script, this file's folder comes first on sys.path and its own
    # name would shadow the `statefiles` package it measures.
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]

from msgspec.structs import replace

from computegroups.daemon.model.claims import Claim, Strategy
from computegroups.daemon.model.requests import ComponentSpec
from computegroups.statefiles import (
    ComponentRecord,
    ComponentState,
    DeviceRecord,
    GroupRecord,
    GroupState,
    MachineFingerprint,
    Role,
    Scope,
    StateDoc,
    StateStore,
    WorkerRecord,
)
from computegroups.statefiles.fileformat import encode_body, seal, validated

SIZES = (10, 100, 1000)
GPUS = 8


def build_doc(groups: int) -> StateDoc:
    """A plausible state: one component per group, one worker each, a quarter-GPU share per group."""
    doc = StateDoc(machine=MachineFingerprint(hostname="bench", gpu_uuids=tuple(_uuid(i) for i in range(GPUS))))
    for n in range(groups):
        name = f"comp-{n:04d}"
        claim = Claim(memory_mib=20000, compute_pct=25, strategy=Strategy.BINPACK)
        doc.components[name] = ComponentRecord(
            name=name, owner_uid=1000, owner_gid=1000, replicas=1, state=ComponentState.RUNNING, created=1.7e9 + n,
            spec=ComponentSpec(claim=claim, command=("python", "serve.py", str(n)), env={"MODEL": f"model-{n}"}),
        )
        gpu = n % GPUS
        gid = f"{name}-0"
        doc.groups[gid] = GroupRecord(
            id=gid, claim=claim, state=GroupState.ALLOCATED, owner=name, owner_uid=1000, owner_gid=1000,
            users=(f"{name}/0",), scope=Scope.PER_REPLICA, replica=0,
            devices=(DeviceRecord(gpu_index=gpu, gpu_uuid=_uuid(gpu), memory_mib=20000, compute_pct=25,
                                  whole=False),),
            domain=(gpu,), created=1.7e9 + n, explanation=f"GPU {gpu}: packed with the others on it",
        )
        worker = WorkerRecord(component=name, replica=0, role=Role.PRIMARY, pid=10000 + n, create_time=1.7e9 + n,
                              started_at=1.7e9 + n)
        doc.workers[worker.key] = worker
    return doc


def measure(directory: Path, groups: int, commits: int) -> dict[str, Any]:
    """Commits that each change one group, interleaved with the floor: the same journal line appended
    and fsync'd once to another file. Then commits that each write a snapshot, as every
    `SNAPSHOT_EVERY`-th commit does."""
    store = StateStore(directory / f"g{groups}")
    store.hold()
    with store.transaction() as doc:
        fresh = build_doc(groups)
        doc.machine, doc.components, doc.groups, doc.workers = (
            fresh.machine, fresh.components, fresh.groups, fresh.workers)
    floor_path = store.directory / "floor.journal"
    commit_s, floor_s = [], []
    ids = list(fresh.groups)
    line = b""
    for n in range(commits):
        start = time.perf_counter()
        with store.transaction() as doc:
            _flip(doc, ids[n % len(ids)])
        commit_s.append(time.perf_counter() - start)
        line = store.journal_path.read_bytes().rsplit(b"\n", 2)[-2] + b"\n"
        start = time.perf_counter()
        _floor_append(floor_path, line)
        floor_s.append(time.perf_counter() - start)
    store.let_go()
    unheld_s = []
    for n in range(max(3, commits // 3)):
        start = time.perf_counter()
        with store.transaction() as doc:
            _flip(doc, ids[n % len(ids)])
        unheld_s.append(time.perf_counter() - start)
    snapshots = StateStore(store.directory, snapshot_every=1)
    snapshot_s = []
    for n in range(max(3, commits // 10)):
        start = time.perf_counter()
        with snapshots.transaction() as doc:
            _flip(doc, ids[n % len(ids)])
        snapshot_s.append(time.perf_counter() - start)
    return {
        "groups": groups,
        "cpu_ms": _cpu_ms(store.load()),
        "bytes": store.path.stat().st_size,
        "line_bytes": len(line),
        "commits": commits,
        "commit_ms": _summary(commit_s),
        "floor_ms": _summary(floor_s),
        "snapshot_ms": _summary(snapshot_s),
        "unheld_ms": _summary(unheld_s),
        "ratio_mean": statistics.fmean(commit_s) / statistics.fmean(floor_s),
        "ratio_p50": statistics.median(commit_s) / statistics.median(floor_s),
    }


def _flip(doc: StateDoc, gid: str) -> None:
    group = doc.groups[gid]
    state = GroupState.DRAINING if group.state == GroupState.ALLOCATED else GroupState.ALLOCATED
    doc.groups[gid] = replace(group, state=state)


def _cpu_ms(doc: StateDoc) -> float:
    """What a snapshot costs the CPU: encoding the whole document and validating what was encoded."""
    start = time.perf_counter()
    for _ in range(5):
        body = encode_body(doc)
        validated(doc.generation, body, doc)
        seal(doc.generation, body)
    return (time.perf_counter() - start) / 5 * 1e3


def run(quick: bool = False, directory: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """One result per size; `directory` should be on the disk the real state lives on (default: here)."""
    results = []
    with tempfile.TemporaryDirectory(prefix="cg-bench-state-", dir=directory or ".") as scratch:
        for groups in SIZES:
            commits = (20 if groups < 1000 else 10) if quick else (300 if groups < 1000 else 60)
            results.append(measure(Path(scratch), groups, commits))
    return results


def format_table(results: list[dict[str, Any]]) -> str:
    header = (f"{'groups':>6} {'snapshot':>9} {'n':>4}  {'commit mean/p50/p99 ms':>24}  "
              f"{'append mean/p50/p99 ms':>24}  {'ratio p50':>9}  {'snapshot p50 ms':>15}  {'unheld p50 ms':>13}")
    lines = [header]
    for r in results:
        c, f = r["commit_ms"], r["floor_ms"]
        lines.append(
            f"{r['groups']:>6} {r['bytes']:>9} {r['commits']:>4}  "
            f"{c['mean']:>8.2f}{c['p50']:>8.2f}{c['p99']:>8.2f}  {f['mean']:>8.2f}{f['p50']:>8.2f}{f['p99']:>8.2f}  "
            f"{r['ratio_p50']:>9.2f}  {r['snapshot_ms']['p50']:>15.2f}  {r['unheld_ms']['p50']:>13.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few commits per size (a smoke run)")
    parser.add_argument("--dir", help="scratch directory, on the filesystem of the real state (default: .)")
    args = parser.parse_args(argv)
    print(format_table(run(args.quick, args.dir)))


def _floor_append(path: Path, payload: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, payload)
        os.fsync(fd)
    finally:
        os.close(fd)


def _summary(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"mean": statistics.fmean(ordered) * 1e3, "p50": statistics.median(ordered) * 1e3, "p99": p99 * 1e3}


def _uuid(index: int) -> str:
    return f"GPU-{index:08x}-0000-4000-8000-000000000000"


if __name__ == "__main__":
    main()
