"""A state document that contradicts itself is refused at start, with the groups named.

Two groups holding one whole GPU, or shares adding up to more than a GPU
has, can only come from a hand edit or a bug; placing more work on top of
either would hand one device to two owners. A machine that changed under
the state (a GPU gone) is not a contradiction: those groups are lost or
degraded and are left out here, as they are left out of the allocator.
"""

from __future__ import annotations

from collections import defaultdict

from computegroups.statefiles.errors import StateError
from computegroups.statefiles.schema import StateDoc
from computegroups.topology.model import Machine


class StateContradiction(StateError):
    """The document holds a device twice or past its capacity."""


def contradictions(doc: StateDoc, machine: Machine) -> list[str]:
    """One sentence per device held twice or past its capacity, naming the groups; empty when none."""
    gpus = {g.uuid: g for g in machine.gpus}
    whole: dict[int, list[str]] = defaultdict(list)
    shared: dict[int, list[str]] = defaultdict(list)
    memory: dict[int, int] = defaultdict(int)
    compute: dict[int, int] = defaultdict(int)
    mig: dict[str, list[str]] = defaultdict(list)
    for g in sorted(doc.groups.values(), key=lambda g: g.id):
        if g.state == "lost" or any(d.gpu_uuid not in gpus for d in g.devices):
            continue
        for d in g.devices:
            index = gpus[d.gpu_uuid].index
            if d.mig_uuid is not None:
                mig[d.mig_uuid].append(g.id)
            elif d.whole:
                whole[index].append(g.id)
            else:
                shared[index].append(g.id)
                memory[index] += d.memory_mib
                compute[index] += d.compute_pct
    found = [f"MIG device {uuid} is held by groups {', '.join(ids)}" for uuid, ids in mig.items() if len(ids) > 1]
    for index in sorted(whole.keys() | shared.keys()):
        holders, sharers = whole.get(index, []), shared.get(index, [])
        if len(holders) > 1 or (holders and sharers):
            others = ", ".join(holders[1:] + sharers)
            found.append(f"GPU {index} is held whole by group {holders[0]} and also by group {others}")
            continue
        total = machine.gpu(index).memory_mib
        if total is not None and memory[index] > total:
            found.append(f"GPU {index} has {total} MiB but groups {', '.join(sharers)} hold {memory[index]} MiB")
        if compute[index] > 100:
            found.append(f"GPU {index} has 100% of its SMs but groups {', '.join(sharers)} hold {compute[index]}%")
    return found


def check_consistent(doc: StateDoc, machine: Machine) -> None:
    """Raise `StateContradiction` naming every device the document holds twice or past capacity."""
    found = contradictions(doc, machine)
    if found:
        raise StateContradiction(
            f"the state (generation {doc.generation}) contradicts itself: {'; '.join(found)}. "
            "It was edited by hand or written by a bug; stop cgd, fix or remove those groups "
            "in the state file (its backup is the previous generation), then start cgd again."
        )
