"""A commit that looks only at the keys its transaction touched finds exactly what a full comparison finds."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from computegroups.statefiles import GroupState, StateDoc, journal
from tests.statefiles.samples import populated_doc

BASE = populated_doc()
KEYS = [*sorted(BASE.groups), "new-0", "new-1"]
EDITS = st.lists(st.tuples(
    st.sampled_from(["set", "same", "del", "pop", "update", "ior", "setdefault", "clear"]),
    st.sampled_from(KEYS),
), max_size=12)


def untracked(doc: StateDoc) -> StateDoc:
    """The same document with plain maps: `diff` compares every record."""
    plain = journal.owned(doc)
    for name in journal.MAPS:
        setattr(plain, name, dict(getattr(plain, name)))
    return plain


def apply_edits(groups: dict[str, Any], edits: list[tuple[str, str]]) -> None:
    template = BASE.groups[sorted(BASE.groups)[0]]
    for kind, key in edits:
        changed = replace(template, id=key, state=GroupState.DRAINING)
        if kind == "set":
            groups[key] = changed
        elif kind == "same" and key in BASE.groups:  # set again to an equal record: no change
            groups[key] = replace(BASE.groups[key])
        elif kind == "del" and key in groups:
            del groups[key]
        elif kind == "pop":
            groups.pop(key, None)
        elif kind == "update":
            groups.update({key: changed})
        elif kind == "ior":
            groups |= {key: changed}
        elif kind == "setdefault":
            groups.setdefault(key, changed)
        elif kind == "clear":
            groups.clear()


@settings(max_examples=300, deadline=None)
@given(EDITS)
def test_the_touched_keys_give_the_full_diff(edits: list[tuple[str, str]]) -> None:
    tracked, plain = journal.owned(BASE), untracked(BASE)
    apply_edits(tracked.groups, edits)
    apply_edits(plain.groups, edits)
    assert isinstance(tracked.groups, journal.Tracked)
    assert journal.diff(BASE, tracked, 2) == journal.diff(BASE, plain, 2)


def test_a_map_put_in_whole_is_compared_record_by_record() -> None:
    doc = journal.owned(BASE)
    gid = sorted(BASE.groups)[0]
    doc.groups = {**BASE.groups, gid: replace(BASE.groups[gid], state=GroupState.DRAINING)}
    entry = journal.diff(BASE, doc, 2)
    assert entry is not None and list(entry.groups) == [gid]
