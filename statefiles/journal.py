"""The journal: one checksummed line per commit, holding what changed and nothing else.

A commit costs what it changes, not the size of the state: the store
appends one `Entry` (the records set or removed, and the top-level fields
that changed) to `state.journal` and fsyncs it; every so often it writes
the whole document as a snapshot (`state.json`) and starts a new journal
(the shape of etcd's WAL + snapshot and Redis' AOF). Loading replays the
entries newer than the snapshot.

Each line is the entry's JSON, a space and `sha256:<hex>` of that JSON, so
a line is readable with `grep` and `jq -R 'split(" sha256:")[0] | fromjson'`.
Records are frozen (see `schema.Record`), so the change is found by identity
first and equality second: nothing is encoded that did not change.

A line that is cut short or fails its checksum is what a crash leaves at
the end of a file: it was never acknowledged (an acknowledgement waits for
the fsync) and is dropped with a warning. The same anywhere else means the
file was damaged after it was written, and loading refuses it. A whole line
whose checksum holds but which is not a valid entry is refused wherever it
is: no crash writes the right checksum over the wrong bytes, so it was
written whole (and may have been acknowledged) and changed since.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from copy import copy as _copy
from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from computegroups.statefiles.errors import StateCorruptError, StateFormatError, StateVersionError
from computegroups.statefiles.schema import (
    SCHEMA_VERSION,
    ComponentRecord,
    DeploymentRecord,
    GroupRecord,
    MachineFingerprint,
    NonNegative,
    ReservationRecord,
    RuleBroken,
    StateDoc,
    WorkerRecord,
    key_step,
)
from computegroups.statefiles.validation import decode as decode_as
from computegroups.statefiles.validation import refuse_non_json

JOURNAL_FILE = "state.journal"
JOURNAL_BACKUP = "state.journal.bak"
MAPS = ("components", "groups", "reservations", "workers", "deployments")
"""The record maps of a `StateDoc`; the rest (`machine`, `drained`) change whole."""
_KEY_OF: dict[str, tuple[str, Callable[[Any], str]]] = {
    "components": ("name", lambda r: r.name),
    "groups": ("id", lambda r: r.id),
    "reservations": ("name", lambda r: r.name),
    "deployments": ("name", lambda r: r.name),
    "workers": ("<component>/<replica>", lambda r: r.key),
}
_ENCODER = msgspec.json.Encoder()
_MARK = b" sha256:"


class Entry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """One commit: the generation it makes, and each record set (or removed: null) under its key.

    The fields carry the names of `StateDoc`'s, so a refusal reads the same
    as one of the whole document: `groups["g1"].users[1]: duplicate 'web'`.
    """

    schema_version: int
    generation: NonNegative
    machine: MachineFingerprint | UnsetType | None = UNSET
    drained: tuple[str, ...] | UnsetType = UNSET
    components: dict[str, ComponentRecord | None] = {}
    groups: dict[str, GroupRecord | None] = {}
    reservations: dict[str, ReservationRecord | None] = {}
    workers: dict[str, WorkerRecord | None] = {}
    deployments: dict[str, DeploymentRecord | None] = {}

    def __post_init__(self) -> None:
        if isinstance(self.drained, tuple) and len(set(self.drained)) != len(self.drained):
            raise RuleBroken("duplicate GPU", ".drained")
        for name in MAPS:
            what, key_of = _KEY_OF[name]
            for key, record in getattr(self, name).items():
                if record is not None and key_of(record) != key:
                    raise RuleBroken(f"{what} must match the key {key!r}, got {key_of(record)!r}",
                                     f".{name}", key_step(key))


class Tracked(dict[str, Any]):
    """A map of an open transaction's document that remembers the keys set or removed in it.

    `owned` hands these out, so a commit looks at those keys alone and
    costs what it changes, not the size of the state. A map replaced whole
    (`doc.groups = {...}`, a document put in whole) is not one of `base`'s
    and is compared record by record.
    """

    __slots__ = ("base", "touched")

    def __init__(self, base: dict[str, Any]) -> None:
        super().__init__(base)
        self.base = base
        self.touched: set[str] = set()

    def __setitem__(self, key: str, value: Any) -> None:
        self.touched.add(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.touched.add(key)
        super().__delitem__(key)

    def pop(self, key: str, *default: Any) -> Any:
        self.touched.add(key)
        return super().pop(key, *default)

    def popitem(self) -> tuple[str, Any]:
        key, value = super().popitem()
        self.touched.add(key)
        return key, value

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __ior__(self, other: Any) -> Tracked:  # type: ignore[override,misc]
        self.update(other)
        return self

    def clear(self) -> None:
        self.touched.update(self)
        super().clear()


def diff(old: StateDoc, new: StateDoc, generation: int) -> Entry | None:
    """What turns `old` into `new`, as the entry of `generation`; None when nothing changed."""
    changes: dict[str, Any] = {}
    for name in MAPS:
        before, after = getattr(old, name), getattr(new, name)
        if before is after:
            continue
        changed: dict[str, Any] = {}
        if isinstance(after, Tracked) and after.base is before:
            candidates: Any = after.touched
        else:
            candidates = after.keys() | before.keys()
        for key in sorted(candidates):
            was, record = before.get(key), after.get(key)
            if was is not record and was != record:
                changed[key] = record
        if changed:
            changes[name] = changed
    if old.machine != new.machine:
        changes["machine"] = new.machine
    if old.drained != new.drained:
        changes["drained"] = new.drained
    if not changes:
        return None
    try:
        return Entry(schema_version=SCHEMA_VERSION, generation=generation, **changes)
    except RuleBroken as broken:  # a record put under another's key: refused like any wrong value
        raise StateFormatError(str(broken)) from None


def encode(entry: Entry) -> bytes:
    """The entry's line, checked: the very bytes written decode, strictly, to what the caller holds.

    msgspec's encoder writes infinity as null and a set as a list, and runs
    no rules; decoding the line back refuses what the file could not hold or
    the rules forbid, with its path, before anything is written.
    """
    try:
        body = _ENCODER.encode(entry)
    except (TypeError, RecursionError) as bad:
        raise _unencodable(entry, bad) from None
    copy = decode_as(body, Entry)
    if copy != entry:
        for name in MAPS:
            for key, record in getattr(entry, name).items():
                if record is not None:
                    refuse_non_json(record, f"{name}{key_step(key)}")
    return b"%b%b%b\n" % (body, _MARK, hashlib.sha256(body).hexdigest().encode())


def _unencodable(entry: Entry, bad: Exception) -> StateFormatError:
    for name in MAPS:
        for key, record in getattr(entry, name).items():
            where = f"{name}{key_step(key)}"
            if record is not None:
                refuse_non_json(record, where)
            try:
                _ENCODER.encode(record)
            except TypeError as failed:
                return StateFormatError(f"{where}: not a JSON value ({failed})")
            except RecursionError:
                return StateFormatError(f"{where}: nested too deeply")
    return StateFormatError(f"top level: not a JSON value ({bad})")


def apply(doc: StateDoc, entry: Entry) -> None:
    """Change `doc` (whose maps the caller owns) as `entry` says, and give it the entry's generation."""
    for name in MAPS:
        changes = getattr(entry, name)
        if not changes:
            continue
        records = getattr(doc, name)
        added = False
        for key, record in changes.items():
            if record is None:
                records.pop(key, None)
            else:
                added = added or key not in records
                records[key] = record
        if added:  # kept in key order, as a loaded file is (see schema._keyed)
            setattr(doc, name, dict(sorted(records.items())))
    if entry.machine is not UNSET:
        doc.machine = entry.machine
    if entry.drained is not UNSET:
        doc.drained = entry.drained
    doc.generation = entry.generation


@dataclass(frozen=True)
class Parsed:
    """A journal file's entries, and what a crash left at its end."""

    entries: tuple[Entry, ...]
    good_length: int
    """Bytes up to the end of the last whole, sound line."""
    torn: str | None
    """Why the bytes after `good_length` were dropped; None when there were none."""


def parse(raw: bytes, path: str) -> Parsed:
    """Every entry of a journal file. A last line cut short or failing its checksum is `torn`; such a line
    before others, or a sealed line that is not a valid entry, is refused."""
    entries: list[Entry] = []
    offset = 0
    while offset < len(raw):
        end = raw.find(b"\n", offset)
        problem: str | None = "cut short (no end of line)"
        if end >= 0:
            line = raw[offset:end]
            problem = _unsealed(line)
            if problem is None:
                entries.append(_entry(line, f"journal {path}: line {len(entries) + 1} (byte {offset})"))
                offset = end + 1
                continue
        if end >= 0 and raw[end + 1:].strip():
            raise StateCorruptError(
                f"journal {path}: the entry at byte {offset} is damaged ({problem}) and entries follow it: "
                "the file changed after it was written. Refusing to load a state with changes missing; "
                "inspect it with `python -m computegroups.statefiles DIR`")
        return Parsed(tuple(entries), offset, f"{len(raw) - offset} bytes at byte {offset}: {problem}")
    return Parsed(tuple(entries), offset, None)


def _unsealed(line: bytes) -> str | None:
    """Why `line` is not as the store wrote it, None when its checksum holds."""
    body, mark, digest = line.rpartition(_MARK)
    if not mark:
        return "no checksum"
    if hashlib.sha256(body).hexdigest().encode() != digest:
        return "checksum mismatch"
    return None


def _entry(line: bytes, where: str) -> Entry:
    """The entry of a sealed line; `where` names the line in a refusal."""
    body = line.rpartition(_MARK)[0]
    try:
        head = msgspec.json.decode(body, type=_Head)
    except msgspec.DecodeError as bad:
        raise _refused(where, f"not an entry: {bad}") from None
    if head.schema_version > SCHEMA_VERSION:
        raise StateVersionError(
            f"{where} was written by schema version {head.schema_version}, but this computegroups reads up to "
            f"version {SCHEMA_VERSION}: upgrade computegroups")
    if head.schema_version != SCHEMA_VERSION:
        raise _refused(where, f"schema_version {head.schema_version}: entries are never migrated")
    try:
        return decode_as(body, Entry)
    except StateFormatError as bad:
        raise _refused(where, str(bad)) from None


def _refused(where: str, problem: str) -> StateCorruptError:
    return StateCorruptError(
        f"{where} has a sound checksum but is not a valid entry ({problem}): it was written whole and changed "
        "since, and may hold an acknowledged change. Refusing to load without it; inspect it with "
        "`python -m computegroups.statefiles DIR`")


class _Head(msgspec.Struct):
    schema_version: int


def replay(doc: StateDoc, entries: list[Entry], where: str) -> StateDoc:
    """`doc` (whose maps the caller owns) brought up to the last entry; entries it already holds are skipped.

    So a replay after a crash between a snapshot and the journal's rotation
    applies nothing twice. A missing generation is refused: what came after
    it was built on a change that is lost.
    """
    for entry in entries:
        if entry.generation <= doc.generation:
            continue
        if entry.generation != doc.generation + 1:
            raise StateCorruptError(
                f"{where}: the journal continues at generation {entry.generation} after {doc.generation}: "
                f"generations {doc.generation + 1} to {entry.generation - 1} are missing")
        apply(doc, entry)
    return doc


def owned(doc: StateDoc) -> StateDoc:
    """A document whose maps are its own and whose records (frozen) are shared: what a change may edit."""
    copy = _copy(doc)  # not msgspec.structs.replace, which checks every record again
    for name in MAPS:
        setattr(copy, name, Tracked(getattr(doc, name)))
    return copy
