"""A separate process that uses the state store the way cgd would, for the multi-process tests.

    python child.py write DIR SEED      commit generation after generation, printing each one acknowledged
                                        (a snapshot every 7 commits); about half of them in groups of up to
                                        GROUP commits made with sync=False and acknowledged after one sync()
    python child.py increment DIR N     after a "go" line on stdin, add 1 to a shared counter N times
    python child.py hold DIR            open a transaction, print "locked", commit when stdin closes

It is a script (not multiprocessing) so that a SIGKILL hits a real, separate
interpreter at an arbitrary instruction, as a crash would.
"""

from __future__ import annotations

import random
import sys

from msgspec.structs import replace

from computegroups.daemon.model.claims import Claim
from computegroups.daemon.model.enums import ComponentState, GroupState, Scope
from computegroups.daemon.model.requests import ComponentSpec
from computegroups.statefiles import (
    ComponentRecord,
    DeviceRecord,
    GroupRecord,
    MachineFingerprint,
    StateDoc,
    StateStore,
)
from computegroups.statefiles.store import SNAPSHOT_EVERY

GPUS = tuple(f"GPU-{n:04d}" for n in range(8))


def content_for(generation: int, doc: StateDoc | None = None) -> StateDoc:
    """The state that generation `generation` of the crash test holds: every field follows from the number."""
    doc = doc if doc is not None else StateDoc()
    doc.generation = generation
    doc.machine = MachineFingerprint(hostname="crash-test", gpu_uuids=GPUS) if generation else None
    doc.components, doc.groups = {}, {}
    for n in range(generation % 40):
        name = f"c{n}"
        doc.components[name] = ComponentRecord(
            name=name, owner_uid=1000, owner_gid=1000, replicas=1, state=ComponentState.RUNNING,
            created=float(n),
            spec=ComponentSpec(env={"GENERATION": str(generation), "PAYLOAD": "x" * (generation % 97)}),
        )
        gpu = (n + generation) % len(GPUS)
        doc.groups[f"{name}-0"] = GroupRecord(
            id=f"{name}-0", claim=Claim(memory_mib=1024), state=GroupState.ALLOCATED, owner=name, users=(f"{name}/0",),
            owner_uid=1000, owner_gid=1000,
            scope=Scope.PER_REPLICA, replica=0, created=float(n), explanation=f"written by generation {generation}",
            devices=(DeviceRecord(gpu_index=gpu, gpu_uuid=GPUS[gpu], memory_mib=1024, compute_pct=10, whole=False),),
        )
    return doc


GROUP = 4
"""The most commits one sync() covers in `write`: a kill may find that many unacknowledged ones on disk."""


def write_forever(store: StateStore, seed: int) -> None:
    rng = random.Random(seed)
    while True:
        if rng.random() < 0.5:
            with store.transaction() as doc:
                content_for(doc.generation + 1, doc)
            print(doc.generation, flush=True)
            continue
        written = []
        for _ in range(rng.randint(1, GROUP)):
            with store.transaction(sync=False) as doc:
                content_for(doc.generation + 1, doc)
            written.append(doc.generation)
        store.sync()
        print("\n".join(map(str, written)), flush=True)


def increment(store: StateStore, times: int) -> None:
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(times):
        with store.transaction() as doc:
            counter = doc.components.get("counter")
            if counter is None:
                counter = doc.components["counter"] = ComponentRecord(
                    name="counter", owner_uid=0, owner_gid=0, replicas=0, state=ComponentState.ALLOCATED,
                    spec=ComponentSpec(env={"COUNT": "0"}),
                )
            doc.components["counter"] = replace(
                counter, spec=replace(counter.spec, env={"COUNT": str(int(counter.spec.env["COUNT"]) + 1)}))


def hold(store: StateStore) -> None:
    with store.transaction() as doc:
        print("locked", flush=True)
        sys.stdin.read()
        doc.drained = ("GPU-held",)


def main(argv: list[str]) -> None:
    mode, directory, *rest = argv
    # Writes snapshot every few entries, so kills land in appends, snapshots and journal rotations alike.
    store = StateStore(directory, lock_timeout=30.0, snapshot_every=7 if mode == "write" else SNAPSHOT_EVERY)
    if mode == "write":
        write_forever(store, int(rest[0]))
    elif mode == "increment":
        increment(store, int(rest[0]))
    elif mode == "hold":
        hold(store)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
