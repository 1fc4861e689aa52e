"""The bytes of a state file: JSON with one record per line, sealed by a checksum.

One record per line keeps a thousand-group file greppable and diffable
(`grep '"state": "lost"' state.json` lists the lost groups) while the
records are still encoded in C, one msgspec call each; `jq . state.json`
pretty-prints it.

The layout is fixed so the store can compare, seal and validate bytes
without re-encoding (`validated` decodes exactly what is about to be
written): the version and generation come first, the records after, and
the last line holds the SHA-256 of every byte before it. A truncated file
fails to parse and a document of the wrong shape fails validation; the
checksum catches the rest — bytes changed inside a string or a number by a
failing disk or a careless edit — which would otherwise load as a quietly
different state. A hand-edited file must drop its checksum line (and the
comma before it); it is then accepted with a warning and sealed again on the
next write.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from computegroups.statefiles.errors import StateFormatError, StateVersionError
from computegroups.statefiles.migrations import migrate
from computegroups.statefiles.schema import SCHEMA_VERSION, StateDoc, key_step
from computegroups.statefiles.validation import convert, describe, refuse_non_json
from computegroups.statefiles.validation import decode as decode_as

CHECKSUM_KEY = "checksum"
_HEAD_KEYS = ("schema_version", "generation")
_BODY_FIELDS = tuple(f.name for f in msgspec.structs.fields(StateDoc) if f.name not in _HEAD_KEYS)
_ENCODER = msgspec.json.Encoder()
_TAIL = re.compile(rb'\n(  "checksum": "sha256:([0-9a-f]{64})"\n}\n?)\Z')


@dataclass(frozen=True)
class Decoded:
    """A state file's document and what loading it took."""

    doc: StateDoc
    migrated_from: int | None
    checksummed: bool


def encode_body(doc: StateDoc) -> bytes:
    """Every line between the generation and the checksum.

    Each record is encoded alone so it gets a line of its own (the machine
    fingerprint, one line per field, as every release has written it);
    `msgspec.json.format` adds the spaces after `,` and `:` that make the
    lines readable and greppable. A value msgspec cannot encode is refused
    with its record's path; every other wrong value is refused by
    `validated`, which decodes these very bytes.
    """
    encode, layout = _ENCODER.encode, msgspec.json.format
    lines = []
    try:
        for name, value in _body_fields(doc):
            if type(value) is dict and value:
                records = [b"    %b: %b" % (encode(key), layout(encode(value[key]), indent=0)) for key in sorted(value)]
                lines.append(b"  %b: {\n%b\n  },\n" % (encode(name), b",\n".join(records)))
            else:
                lines.append(b"  %b: %b,\n" % (encode(name), layout(encode(value), indent=0)))
    except (TypeError, RecursionError) as bad:
        raise _unencodable(doc, bad) from None
    return b"".join(lines)


def validated(generation: int, body: bytes, doc: StateDoc | None = None) -> StateDoc:
    """The document that `seal(generation, body)` holds, decoded strictly: a copy nothing else shares.

    Given the `doc` that `body` was encoded from, also refuses what the
    encoder let through but changed on the way (infinity written as null, a
    set as a list) in the opaque objects msgspec does not validate. The copy
    equals `doc` unless something changed, so the search for what changed
    runs only then; a difference of form alone (a tuple that comes back as a
    list) is accepted.
    """
    copy = decode_as(b"".join((_head(generation, SCHEMA_VERSION), memoryview(body)[:-2], b"\n}")), StateDoc)
    if doc is not None and any(getattr(copy, name) != getattr(doc, name) for name in _BODY_FIELDS):
        for name, value in _body_fields(doc):
            for key, record in _records(value):
                refuse_non_json(record, f"{name}{key_step(key)}")
    return copy


def _body_fields(doc: StateDoc) -> Iterator[tuple[str, Any]]:
    for name in _BODY_FIELDS:
        value = getattr(doc, name)
        if isinstance(value, msgspec.Struct):
            # The machine record is laid out as a map, as the first release wrote it.
            value = {field: getattr(value, field) for field in value.__struct_fields__}
        yield name, value


def _records(value: Any) -> Iterator[tuple[str, msgspec.Struct]]:
    if type(value) is dict:
        yield from ((str(key), record) for key, record in value.items() if isinstance(record, msgspec.Struct))


def _unencodable(doc: StateDoc, bad: Exception) -> StateFormatError:
    """Which record msgspec could not encode, found again record by record (a refusal, never the hot path)."""
    for name, value in _body_fields(doc):
        for key, record in _records(value):
            where = f"{name}{key_step(key)}"
            refuse_non_json(record, where)
            try:
                _ENCODER.encode(record)
            except TypeError as failed:
                return StateFormatError(f"{where}: not a JSON value ({failed})")
            except RecursionError:
                return StateFormatError(f"{where}: nested too deeply")
        try:
            _ENCODER.encode(value)
        except TypeError as failed:
            return StateFormatError(f"{name}: not a JSON value ({failed})")
    return StateFormatError(f"top level: not a JSON value ({bad})")


def seal(generation: int, body: bytes, schema_version: int = SCHEMA_VERSION) -> bytes:
    """The whole file: head, body and the checksum line over both."""
    head = _head(generation, schema_version)
    digest = hashlib.sha256(head + body).hexdigest()
    return b"".join((head, body, f'  "{CHECKSUM_KEY}": "sha256:{digest}"\n}}\n'.encode()))


def decode(raw: bytes) -> Decoded:
    """Parse, check, migrate and validate; `StateFormatError` says why a file is unusable."""
    data = _parse(raw)
    version = data.get("schema_version")
    if type(version) is not int:
        problem = f"expected int, got {describe(version)}" if "schema_version" in data else "missing"
        raise StateFormatError(f"schema_version: {problem}")
    if version > SCHEMA_VERSION:
        raise StateVersionError(
            f"written by schema version {version}, but this computegroups reads up to version {SCHEMA_VERSION}: "
            "upgrade computegroups (never edit the file down by hand)"
        )
    sealed = CHECKSUM_KEY in data
    if sealed:
        _verify(raw, data.pop(CHECKSUM_KEY))
    migrated_from = None
    if version < SCHEMA_VERSION:
        migrated_from = version
        data = migrate(data)
    return Decoded(convert(data, StateDoc), migrated_from, sealed)


def _head(generation: int, schema_version: int) -> bytes:
    return b'{\n  "schema_version": %d,\n  "generation": %d,\n' % (schema_version, generation)


def _verify(raw: bytes, stored: Any) -> None:
    tail = _TAIL.search(raw, max(0, len(raw) - 100))
    if tail is None:
        raise StateFormatError(
            "checksum: the file is not laid out as cgd writes it (re-formatted by hand?); "
            "after a hand edit remove the checksum line"
        )
    digest = hashlib.sha256(raw[: tail.start(1)]).hexdigest()
    if digest != tail.group(2).decode() or stored != f"sha256:{digest}":
        raise StateFormatError("checksum mismatch: the content changed after it was written")


def _parse(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise StateFormatError(f"empty file ({len(raw)} bytes)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        raise StateFormatError(f"not UTF-8 text: garbage bytes at offset {bad.start}") from None
    try:
        data = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except json.JSONDecodeError as bad:
        if bad.pos >= len(text.rstrip()) or bad.msg.startswith("Unterminated string"):
            raise StateFormatError(f"truncated: the JSON stops after {len(raw)} bytes") from None
        raise StateFormatError(f"not valid JSON: {bad.msg} at line {bad.lineno} column {bad.colno}") from None
    except (ValueError, RecursionError) as bad:
        raise StateFormatError(f"not valid JSON: {bad}") from None
    if type(data) is not dict:
        raise StateFormatError(f"top level: expected object, got {describe(data)}")
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite(literal: str) -> float:
    """`1e400` parses as infinity, which no state holds: the encoder would write it back as null."""
    value = float(literal)
    if not math.isfinite(value):
        raise ValueError(f"{literal} is too large a number")
    return value
