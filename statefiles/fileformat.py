"""The bytes of a state file: JSON with one record per line, sealed by a checksum.

One record per line keeps a thousand-group file greppable and diffable
(`grep '"state": "lost"' state.json` lists the lost groups) and lets the
C JSON encoder do the work: an indented dump goes through the pure-Python
encoder and is several times slower. `jq . state.json` pretty-prints it.

The layout is fixed so the store can compare and seal bytes without
re-encoding: the version and generation come first, the records after, and
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
import re
from dataclasses import dataclass
from typing import Any

from computegroups.statefiles.codec import describe
from computegroups.statefiles.errors import StateFormatError, StateVersionError
from computegroups.statefiles.migrations import migrate
from computegroups.statefiles.schema import SCHEMA_VERSION, StateDoc

CHECKSUM_KEY = "checksum"
_HEAD_KEYS = ("schema_version", "generation")
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(", ", ": "))
_TAIL = re.compile(rb'\n(  "checksum": "sha256:([0-9a-f]{64})"\n}\n?)\Z')


@dataclass(frozen=True)
class Decoded:
    """A state file's document and what loading it took."""

    doc: StateDoc
    migrated_from: int | None
    checksummed: bool


def encode_body(data: dict[str, Any]) -> bytes:
    """Every line between the generation and the checksum, for a validated document."""
    lines = []
    for key, value in data.items():
        if key in _HEAD_KEYS:
            continue
        name = _ENCODER.encode(key)
        if type(value) is dict and value:
            records = ",\n".join(
                f"    {_ENCODER.encode(k)}: {_ENCODER.encode(v)}" for k, v in sorted(value.items())
            )
            lines.append(f"  {name}: {{\n{records}\n  }},\n")
        else:
            lines.append(f"  {name}: {_ENCODER.encode(value)},\n")
    return "".join(lines).encode("utf-8")


def seal(generation: int, body: bytes, schema_version: int = SCHEMA_VERSION) -> bytes:
    """The whole file: head, body and the checksum line over both."""
    head = f'{{\n  "schema_version": {schema_version},\n  "generation": {generation},\n'.encode()
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
    return Decoded(StateDoc.from_dict(data), migrated_from, sealed)


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
        data = json.loads(text, parse_constant=_no_constant)
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
