"""The ledger a keeper follows transaction by transaction is the one a fresh keeper derives from the document.

The keeper looks only at the groups a transaction touched or placed; these
properties run random sequences of allocations, releases, drains, failed
transactions and documents put in whole, and compare its ledger with the one
a new keeper builds from the committed document after every step.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from computegroups.daemon.core.keeper import StateKeeper
from computegroups.daemon.core.transactions import Caller, new_component_records, remove_component
from computegroups.daemon.model.claims import Claim
from computegroups.daemon.model.config import DaemonConfig
from computegroups.daemon.model.enums import GroupState
from computegroups.daemon.model.errors import ManagerError
from computegroups.daemon.model.requests import ComponentRequest
from computegroups.statefiles.store import StateStore
from computegroups.topology import load_machine

ROOT = Caller(pid=1, uid=0, gid=0)
MACHINE = load_machine("dgx-h100")
CLAIMS = st.one_of(
    st.builds(lambda n: Claim(gpus=n), st.integers(1, 4)),
    st.builds(lambda m: Claim(memory_mib=m), st.sampled_from([1024, 20480, 40960])),
)


class Boom(Exception):
    """A transaction that fails after it changed the document."""


Step = tuple[str, int, Claim, bool, bool]
STEPS = st.lists(st.tuples(
    st.sampled_from(["allocate", "release", "drain", "whole", "place"]),
    st.integers(0, 2),
    CLAIMS,
    st.booleans(),  # then allocate another component in the same transaction
    st.booleans(),  # then fail
), max_size=25)


def ledger(k: StateKeeper) -> tuple[object, ...]:
    return (k.allocator.holdings(), sorted(k.allocator.ledger.unavailable))


def step(k: StateKeeper, kind: str, index: int, claim: Claim, more: bool, fail: bool) -> None:
    n = f"c{index}"
    try:
        with k.transaction() as doc:
            if kind == "allocate" and n not in doc.components:
                new_component_records(doc, k, ComponentRequest(name=n, claim=claim), ROOT)
            elif kind == "release" and n in doc.components:
                remove_component(doc, k, n, {n})
            elif kind == "drain":
                for gid, g in doc.groups.items():
                    if g.owner == n:
                        state = GroupState.ALLOCATED if g.state == GroupState.DRAINING else GroupState.DRAINING
                        doc.groups[gid] = replace(g, state=state)
            elif kind == "place":  # placed, never recorded: the ledger must let it go again
                k.place(doc, claim, [f"{n}-placed"], n)
            elif kind == "whole":  # a map put in whole (as `restore` puts a document), one component gone
                whole = copy.deepcopy(doc)
                if n in whole.components:
                    remove_component(whole, k, n, {n})
                doc.groups, doc.components, doc.workers = whole.groups, whole.components, whole.workers
            extra = f"x{index}"
            if more and extra not in doc.components:
                new_component_records(doc, k, ComponentRequest(name=extra, claim=claim), ROOT)
            if fail:
                raise Boom
    except (Boom, ManagerError):
        pass


@settings(max_examples=300, deadline=None)
@given(STEPS)
@example([("allocate", 1, Claim(gpus=2), False, False), ("whole", 1, Claim(gpus=2), True, True)])
@example([("allocate", 1, Claim(gpus=2), False, False), ("drain", 1, Claim(gpus=2), False, False),
          ("release", 1, Claim(gpus=2), False, False)])
@example([("place", 0, Claim(gpus=1), False, False), ("place", 0, Claim(gpus=1), False, True)])
def test_the_followed_ledger_is_the_one_derived_from_the_document(steps: list[Step]) -> None:
    with tempfile.TemporaryDirectory() as state:
        k = StateKeeper(MACHINE, StateStore(Path(state)), DaemonConfig())
        for action in steps:
            step(k, *action)
            fresh = StateKeeper(MACHINE, StateStore(Path(state)), DaemonConfig())
            assert ledger(k) == ledger(fresh), action
