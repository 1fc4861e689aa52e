"""msgspec's refusals in the state file's words, and the values its encoder would let through.

The state file is the daemon's memory across restarts: a value of the wrong
type must be refused with the exact place named
(`groups["g1"].devices[0].memory_mib: expected int, got string`), not
surface later as a puzzling failure deep in the manager. msgspec finds the
problem in C but says `$.groups[...].devices[0].memory_mib`: it does not
name the map key. Only when something is refused, the error is walked along
the document to find that key, and its wording is put in the terms of the
file (string, number, list, object) with the bounds or choices that were
broken.

msgspec's encoder writes a non-finite float as `null` and a set as a list,
and the opaque objects (specs, claims: `dict[str, Any]`) are not validated
on decode, so `refuse_non_json` checks those objects before they are
written: a quietly different state would be worse than a refusal.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from enum import Enum
from functools import cache
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import msgspec

from computegroups.statefiles.errors import StateFormatError
from computegroups.statefiles.schema import RuleBroken, key_step

T = TypeVar("T")

_STEP = re.compile(r"\.([A-Za-z_]\w*)|\[(\d+)\]|(\[\.\.\.\])")
_MISMATCH = re.compile(r"Expected `([^`]+)`, got `([^`]+)`")
_BOUND = re.compile(r"Expected `([^`]+)` ([<>]=?) \S+")
_JSON_NAMES = {
    "str": "string", "float": "number", "bool": "boolean", "array": "list", "tuple": "list", "dict": "object",
    "NoneType": "null",
}


class _NotJSON(Exception):
    """A value JSON cannot hold; each container on the way out adds its step of the path."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.steps: list[str] = []


def convert(data: Any, cls: type[T]) -> T:
    """Build `cls` from parsed JSON (a loaded or migrated file), refusing exactly as a decode would."""
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as bad:
        raise refusal(bad, data, cls) from None


def decode(raw: bytes, cls: type[T]) -> T:
    """Build `cls` from JSON bytes; the bytes are parsed a second time only to name a refused value."""
    try:
        return msgspec.json.decode(raw, type=cls)
    except msgspec.ValidationError as bad:
        raise refusal(bad, msgspec.json.decode(raw), cls) from None


def describe(value: Any) -> str:
    """The JSON name of a value's type, for 'expected X, got Y'."""
    if value is None:
        return "null"
    names = {bool: "boolean", int: "int", float: "number", str: "string", list: "list", dict: "object"}
    return names.get(type(value), type(value).__name__)


def refusal(error: msgspec.ValidationError, data: Any, cls: Any) -> StateFormatError:
    """`error`, raised converting `data` to `cls`, as `path: problem` with the map keys named."""
    where, problem = _explain(error, data, cls)
    return StateFormatError(f"{where.lstrip('.') or 'top level'}: {problem}")


def _explain(error: msgspec.ValidationError, data: Any, tp: Any) -> tuple[str, str]:
    message, at, path = str(error).rpartition(" - at `")
    if not at:
        message, path = str(error), "$`"
    key_of_map = path.startswith("key` in `")
    if key_of_map:
        path = path[len("key` in `"):]
    shown, pos = "", 1
    while pos < len(path) - 1:
        step = _STEP.match(path, pos)
        if step is None:
            shown += path[pos:-1]
            break
        pos = step.end()
        field, index, some_key = step.groups()
        tp = _bare(tp)
        if field is not None:
            shown += f".{field}"
            data = data.get(field) if isinstance(data, dict) else None
            tp = _field_types(tp).get(field, Any)
        elif index is not None:
            shown += f"[{index}]"
            data = data[int(index)] if isinstance(data, (list, tuple)) and int(index) < len(data) else None
            tp = _item_type(tp)
        else:
            found = _failing_entry(data, _item_type(tp))
            if found is None:
                shown += some_key
                data, tp = None, Any
                continue
            key, value, inner = found
            deeper, problem = _explain(inner, value, _item_type(tp))
            return shown + key_step(key) + deeper, problem
    steps, problem = _problem(message, error.__cause__, tp, data, key_of_map)
    return shown + steps, problem


def _failing_entry(data: Any, value_type: Any) -> tuple[str, Any, msgspec.ValidationError] | None:
    """msgspec says `[...]` for a map value: the entry it refused is the first one that fails alone."""
    if not isinstance(data, dict):
        return None
    for key, value in data.items():
        try:
            msgspec.convert(value, value_type)
        except msgspec.ValidationError as inner:
            return str(key), value, inner
    return None


def _problem(message: str, cause: BaseException | None, tp: Any, value: Any, key_of_map: bool) -> tuple[str, str]:
    """The steps below the reported path (a missing field, a rule's own steps) and the problem in our words."""
    if isinstance(cause, RuleBroken):
        return "".join(cause.steps), cause.problem
    if key_of_map:
        mismatch = _MISMATCH.fullmatch(message)
        got = _json_name(mismatch.group(2)) if mismatch else "another type"
        return "", f"object keys must be strings, got {got}"
    if (unknown := re.fullmatch(r"Object contains unknown field `(.+)`", message)) is not None:
        names = ", ".join(f.name for f in msgspec.structs.fields(_bare(tp)))
        return _field_step(unknown.group(1)), f"unknown key (expected one of: {names})"
    if (missing := re.fullmatch(r"Object missing required field `(.+)`", message)) is not None:
        return _field_step(missing.group(1)), "missing"
    if (mismatch := _MISMATCH.fullmatch(message)) is not None:
        expected = " or ".join(_json_name(name) for name in mismatch.group(1).split(" | "))
        return "", f"expected {expected}, got {_json_name(mismatch.group(2))}"
    if _BOUND.fullmatch(message) is not None:
        return "", f"must be {_bounds(tp)}, got {value!r}"
    enum = _enum_of(tp)
    if enum is not None and message.startswith("Invalid enum value"):
        return "", f"must be one of {', '.join(str(member.value) for member in enum)}, got {value!r}"
    return "", message[:1].lower() + message[1:]


def _json_name(msgspec_name: str) -> str:
    return _JSON_NAMES.get(msgspec_name, msgspec_name)


def _field_step(name: str) -> str:
    return f".{name}" if name.isidentifier() else key_step(name)


def _bounds(tp: Any) -> str:
    low = high = None
    for meta in _metas(tp):
        low = meta.ge if meta.ge is not None else low
        high = meta.le if meta.le is not None else high
    if low is not None and high is not None:
        return f"between {low} and {high}"
    return f">= {low}" if high is None else f"<= {high}"


def _metas(tp: Any) -> Iterator[msgspec.Meta]:
    for option in _options(tp):
        if get_origin(option) is Annotated:
            yield from (extra for extra in get_args(option)[1:] if isinstance(extra, msgspec.Meta))


def _enum_of(tp: Any) -> type[Enum] | None:
    for option in _options(tp):
        option = _bare(option)
        if isinstance(option, type) and issubclass(option, Enum):
            return option
    return None


def _options(tp: Any) -> tuple[Any, ...]:
    """The types of `X | None` but None, or `tp` alone."""
    if get_origin(tp) is Union or type(tp).__name__ == "UnionType":
        return tuple(arg for arg in get_args(tp) if arg is not type(None))
    return (tp,)


def _bare(tp: Any) -> Any:
    """`tp` without `Annotated` and without `| None`, to look inside it."""
    options = _options(tp)
    tp = options[0] if len(options) == 1 else tp
    return get_args(tp)[0] if get_origin(tp) is Annotated else tp


@cache
def _field_types(cls: Any) -> dict[str, Any]:
    if not (isinstance(cls, type) and issubclass(cls, msgspec.Struct)):
        return {}
    return {f.name: f.type for f in msgspec.structs.fields(cls)}


def _item_type(tp: Any) -> Any:
    """The type of a list's items or a map's values."""
    args = get_args(_bare(tp))
    return args[-1] if args and args[-1] is not Ellipsis else args[0] if args else Any


@cache
def opaque_fields(cls: type[msgspec.Struct]) -> tuple[str, ...]:
    """The fields of a record that msgspec takes as they are (`dict[str, Any]`): the ones `refuse_non_json` checks.

    A field that becomes a typed Struct drops out of this list by itself:
    decoding what was written then validates it.
    """
    return tuple(f.name for f in msgspec.structs.fields(cls) if f.type == dict[str, Any])


def refuse_non_json(record: msgspec.Struct, where: str) -> None:
    """Refuse a value in an opaque field that JSON cannot hold, or that would come back as something else."""
    for name in opaque_fields(type(record)):
        try:
            _check_object(getattr(record, name))
        except _NotJSON as bad:
            steps = "".join(reversed(bad.steps))
            raise StateFormatError(f"{where.lstrip('.')}.{name}{steps}: {bad.problem}") from None
        except RecursionError:
            raise StateFormatError(f"{where.lstrip('.')}.{name}: nested too deeply") from None


def _check_object(value: Any) -> None:
    if type(value) is not dict:
        raise _NotJSON(f"expected object, got {describe(value)}")
    for key, item in value.items():
        if type(key) is not str:
            raise _NotJSON(f"object keys must be strings, got {describe(key)} {key!r}")
        kind = type(item)
        if kind is str or kind is int or kind is bool or item is None:
            continue
        try:
            _check_value(item)
        except _NotJSON as bad:
            bad.steps.append(key_step(key))
            raise


def _check_value(value: Any) -> None:
    kind = type(value)
    if kind is dict:
        _check_object(value)
    elif kind is list or kind is tuple:
        for index, item in enumerate(value):
            kind = type(item)
            if kind is str or kind is int or kind is bool or item is None:
                continue
            try:
                _check_value(item)
            except _NotJSON as bad:
                bad.steps.append(f"[{index}]")
                raise
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _NotJSON(f"expected a finite number, got {value}")
    elif not isinstance(value, (str, int)):
        raise _NotJSON(f"expected a JSON value, got {describe(value)}")
