"""What must hold whatever happened to cgd and its workers, read from disk and /proc.

Each check returns the violations it found as sentences, so a failing round
says everything that broke at once. Facts come from the state file (through
`StateStore.load`, as any reader would), from the daemon's answers, and from
/proc: a worker is what the kernel runs, not what cgd believes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from computegroups.statefiles.schema import StateDoc
from computegroups.statefiles.store import StateStore
from tests.daemon_fixture import Cgd


@dataclass
class Ledger:
    """What clients were told. A request whose answer was lost (cgd died
    mid-request) makes its component `uncertain` until the round ends, when
    the state decides."""

    replicas: dict[str, int | None] = field(default_factory=dict)
    """Acknowledged and not released; the replica count last acknowledged (None: not tracked)."""
    gone: set[str] = field(default_factory=set)
    uncertain: set[str] = field(default_factory=set)

    def created(self, name: str, replicas: int | None) -> None:
        self.replicas[name] = replicas
        self.gone.discard(name)

    def released(self, names: list[str]) -> None:
        for name in names:
            self.replicas.pop(name, None)
            self.gone.add(name)

    def refused(self, name: str) -> None:
        """A refusal means the name was not created, unless an earlier lost
        answer may have created it (then the refusal is "it exists")."""
        if name not in self.uncertain and name not in self.replicas:
            self.gone.add(name)

    def unknown(self, name: str) -> None:
        self.replicas.pop(name, None)
        self.gone.discard(name)
        self.uncertain.add(name)

    def settle(self, doc: StateDoc) -> None:
        """The uncertain components are whatever the state says they are."""
        for name in self.uncertain:
            comp = doc.components.get(name)
            if comp is None:
                self.gone.add(name)
            else:
                self.replicas[name] = None if comp.shadow_of else comp.replicas
        self.uncertain.clear()


def load(cgd: Cgd) -> StateDoc:
    return StateStore(cgd.state_dir).load()


def capacity(doc: StateDoc, memory_by_gpu: dict[int, int]) -> list[str]:
    """No GPU gives more memory or compute than it has; a whole GPU is one group's alone."""
    problems = []
    by_gpu: dict[int, list[tuple[str, Any]]] = {}
    for g in doc.groups.values():
        for d in g.devices:
            by_gpu.setdefault(d.gpu_index, []).append((g.id, d))
    for gpu, held in sorted(by_gpu.items()):
        whole = [gid for gid, d in held if d.whole and d.mig_uuid is None]
        if whole and len(held) > 1:
            problems.append(f"GPU {gpu} is held whole by {whole} and also by {[gid for gid, _ in held]}")
        memory = sum(d.memory_mib for _, d in held)
        if memory > memory_by_gpu[gpu]:
            problems.append(f"GPU {gpu}: {memory} MiB given out of {memory_by_gpu[gpu]}")
        compute = sum(d.compute_pct for _, d in held)
        if compute > 100:
            problems.append(f"GPU {gpu}: {compute}% compute given out")
    for g in doc.groups.values():
        if g.exclusive_domain:
            intruders = sorted({gid for gpu in g.exclusive_domain for gid, _ in by_gpu.get(gpu, [])
                                if doc.groups[gid].owner_uid != g.owner_uid})
            if intruders:
                problems.append(f"group {g.id} holds GPUs {g.exclusive_domain} exclusively, yet {intruders} use them")
    return problems


def acknowledged(doc: StateDoc, ledger: Ledger) -> list[str]:
    """Every acknowledged allocation is there with its replicas; every acknowledged release is not."""
    problems = []
    for name, replicas in sorted(ledger.replicas.items()):
        comp = doc.components.get(name)
        if comp is None or comp.state == "releasing":
            problems.append(f"component {name} was acknowledged but is {'releasing' if comp else 'missing'}")
        elif replicas is not None and comp.replicas != replicas:
            problems.append(f"component {name} has {comp.replicas} replicas, {replicas} were acknowledged")
    for name in sorted(ledger.gone & set(doc.components)):
        problems.append(f"component {name} is in the state, yet its release (or refusal) was acknowledged")
    for gid, g in sorted(doc.groups.items()):
        if g.state == "reserved":
            continue
        owners = {u.split("/")[0] for u in g.users} | {g.owner}
        if not owners & set(doc.components) and not g.owner.startswith("@"):
            problems.append(f"group {gid} belongs to no component ({sorted(owners)})")
    return problems


def expected_workers(doc: StateDoc) -> set[str]:
    """The replicas that should have a process: their component has a command and did not give up."""
    return {ref for ref, w in doc.workers.items()
            if w.component in doc.components and doc.components[w.component].state not in ("failed", "releasing")}


def processes(cgd: Cgd, doc: StateDoc, components: list[dict[str, Any]]) -> list[str]:
    """Each expected replica runs exactly one main process; every other process
    of this instance is a child of a replica that runs now (nothing of a
    released, failed or restarted worker is left: no orphan, no leftover
    watcher); each has the CUDA_VISIBLE_DEVICES of its groups."""
    problems = []
    marked = set(cgd.worker_pids())
    owner: dict[int, str] = {}
    for comp in components:
        for r in comp["replicas"]:
            ref = f"{comp['name']}/{r['index']}"
            live = [p for p in r["pids"] if p in marked]
            if len(r["pids"]) > 1:
                problems.append(f"{ref} has {len(r['pids'])} processes: {r['pids']}")
            if ref in expected_workers(doc) and not live:
                problems.append(f"{ref} should run but has no live process (cgd says {r['pids']})")
            for pid in live:
                owner[pid] = ref
                problems.extend(_environment(pid, ref, doc, r["cuda_visible_devices"]))
    running = set(owner.values())
    for pid in sorted(marked - set(owner)):
        env = environ(pid)
        if env is None:
            continue  # ended while we looked
        if f"{env.get('CG_COMPONENT')}/{env.get('CG_REPLICA')}" not in running:
            problems.append(f"pid {pid} ({_describe(pid)}) carries this cgd's marker but no running replica owns it")
    return problems


def _environment(pid: int, ref: str, doc: StateDoc, told: str) -> list[str]:
    env = environ(pid)
    if env is None:
        return []
    name, replica = ref.split("/")
    devices = sorted({d.gpu_index for g in doc.groups.values() if ref in g.users for d in g.devices})
    wanted = ",".join(map(str, devices))
    problems = []
    if (env.get("CG_COMPONENT"), env.get("CG_REPLICA")) != (name, replica):
        problems.append(f"pid {pid} of {ref} says it is {env.get('CG_COMPONENT')}/{env.get('CG_REPLICA')}")
    if env.get("CUDA_VISIBLE_DEVICES") != wanted or told != wanted:
        problems.append(f"{ref} (pid {pid}) runs with CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r}, "
                        f"cgd says {told!r}, its groups hold {wanted!r}")
    return problems


def environ(pid: int) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return dict(item.decode(errors="replace").split("=", 1) for item in raw.split(b"\0") if b"=" in item)


def _describe(pid: int) -> str:
    env = environ(pid) or {}
    return f"{env.get('CG_COMPONENT')}/{env.get('CG_REPLICA')} role {env.get('CG_ROLE')}"


def settled(cgd: Cgd) -> tuple[StateDoc, list[dict[str, Any]]] | None:
    """The state and cgd's view once every expected worker runs and nothing else does; else None."""
    status, reply = cgd.request("GET", "/v1/components")
    if status != 200:
        return None
    doc = load(cgd)
    components = reply["components"]
    return None if processes(cgd, doc, components) else (doc, components)


def check_all(cgd: Cgd, ledger: Ledger, memory_by_gpu: dict[int, int], timeout: float = 30.0) -> list[str]:
    """Wait for restarts to finish (bounded), then every invariant at once."""
    deadline = time.monotonic() + timeout
    while (found := settled(cgd)) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    doc = load(cgd)
    status, reply = cgd.request("GET", "/v1/components")
    assert status == 200, reply
    problems = [] if found else [f"workers did not settle within {timeout}s"]
    ledger.settle(doc)
    return (problems + capacity(doc, memory_by_gpu) + acknowledged(doc, ledger)
            + processes(cgd, doc, reply["components"]))


def gpu_memory(cgd: Cgd) -> dict[int, int]:
    status, machine = cgd.request("GET", "/v1/machine")
    assert status == 200, machine
    return {g["index"]: g["memory_mib"] for g in machine["gpus"]}
