"""Strict, path-naming conversion between JSON values and the state records.

The state file is the daemon's memory across restarts: a value of the wrong
type must be refused on load with the exact place named
(`groups["g1"].devices[0].memory_mib: expected int, got string`), not surface
later as a puzzling failure deep in the manager.

Converters are built once per record class from its type hints, and the path
of a bad value is assembled only while the error unwinds, so a state with a
thousand groups converts in about ten milliseconds.
"""

from __future__ import annotations

import json
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from functools import cache
from typing import Any, TypeVar

from computegroups.statefiles.errors import StateFormatError

T = TypeVar("T")
Convert = Callable[[Any], Any]


class Invalid(Exception):
    """Raised deep inside a conversion; each container on the way out adds its step of the path.

    A record's `_validate()` hook raises it for rules that span fields, with
    the steps below the record (`Invalid("must match the key", ".id")`).
    """

    def __init__(self, problem: str, *where: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.steps: list[str] = list(reversed(where))


def from_json(cls: type[T], value: Any, path: str = "") -> T:
    """Build a `cls` record from parsed JSON, refusing unknown keys, missing keys and wrong types."""
    try:
        return typing.cast(T, _decoder(typing.cast(Any, cls))(value))
    except Invalid as bad:
        where = path + "".join(reversed(bad.steps))
        raise StateFormatError(f"{where.lstrip('.') or 'top level'}: {bad.problem}") from None
    except RecursionError:
        raise StateFormatError(f"{path.lstrip('.') or 'top level'}: nested too deeply") from None


def to_json(record: Any) -> Any:
    """The JSON form of a record: tuples become lists; opaque objects are shared, not copied."""
    return _encoder(typing.cast(Any, type(record)))(record)


def key_step(key: str) -> str:
    """A mapping key as it appears in an error path: `["g1"]`."""
    return f"[{json.dumps(key, ensure_ascii=False)}]"


def describe(value: Any) -> str:
    """The JSON name of a value's type, for 'expected X, got Y'."""
    if value is None:
        return "null"
    names = {bool: "boolean", int: "int", float: "number", str: "string", list: "list", dict: "object"}
    return names.get(type(value), type(value).__name__)


def check_choices(*allowed: str) -> dict[str, Any]:
    """Field metadata: the value must be one of `allowed`."""
    return {"check": _choices(allowed)}


def check_range(low: int | None = None, high: int | None = None) -> dict[str, Any]:
    """Field metadata: an int (or every int of a tuple) within [low, high]."""
    return {"check": _range(low, high)}


def _choices(allowed: tuple[str, ...]) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value not in allowed:
            raise Invalid(f"must be one of {', '.join(allowed)}, got {value!r}")

    return check


def _range(low: int | None, high: int | None) -> Callable[[Any], None]:
    def check_one(value: int) -> None:
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = f">= {low}" if high is None else f"<= {high}" if low is None else f"between {low} and {high}"
            raise Invalid(f"must be {bounds}, got {value}")

    def check(value: Any) -> None:
        if isinstance(value, tuple):
            for index, item in enumerate(value):
                try:
                    check_one(item)
                except Invalid as bad:
                    bad.steps.append(f"[{index}]")
                    raise
        elif value is not None:
            check_one(value)

    return check


# Decoders: JSON value -> record value.


def _int(value: Any) -> int:
    if type(value) is int:
        return value
    raise Invalid(f"expected int, got {describe(value)}")


def _float(value: Any) -> float:
    if type(value) is float and math.isfinite(value):
        return value
    if type(value) is int:
        return float(value)
    raise Invalid(f"expected number, got {describe(value) if type(value) is not float else value}")


def _str(value: Any) -> str:
    if type(value) is str:
        return value
    raise Invalid(f"expected string, got {describe(value)}")


def _bool(value: Any) -> bool:
    if type(value) is bool:
        return value
    raise Invalid(f"expected boolean, got {describe(value)}")


def _json_value(value: Any) -> Any:
    """A fresh copy of an opaque JSON value, so a record never aliases the parsed file or the caller."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is dict:
        return _json_object(value)
    if kind is list or kind is tuple:
        return _json_list(value)
    if kind is float and math.isfinite(value):
        return value
    if kind is float:
        raise Invalid(f"expected a finite number, got {value}")
    raise Invalid(f"expected a JSON value, got {describe(value)}")


def _json_object(value: dict[Any, Any]) -> dict[str, Any]:
    out = {}
    for key, item in value.items():
        if type(key) is not str:
            raise Invalid(f"object keys must be strings, got {describe(key)} {key!r}")
        kind = type(item)
        if kind is str or kind is int or kind is bool or item is None:
            out[key] = item
            continue
        try:
            out[key] = _json_value(item)
        except Invalid as bad:
            bad.steps.append(key_step(key))
            raise
    return out


def _json_list(value: list[Any] | tuple[Any, ...]) -> list[Any]:
    items = []
    for index, item in enumerate(value):
        kind = type(item)
        if kind is str or kind is int or kind is bool or item is None:
            items.append(item)
            continue
        try:
            items.append(_json_value(item))
        except Invalid as bad:
            bad.steps.append(f"[{index}]")
            raise
    return items


_PRIMITIVES: dict[Any, Convert] = {int: _int, float: _float, str: _str, bool: _bool, Any: _json_value}


@cache
def _decoder(tp: Any) -> Convert:
    if tp in _PRIMITIVES:
        return _PRIMITIVES[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _optional_decoder(tp, args)
    if origin is tuple:
        return _tuple_decoder(_decoder(args[0]))
    if origin is dict and args[1] is Any:
        return _opaque_object
    if origin is dict:
        return _dict_decoder(_decoder(args[1]))
    if is_dataclass(tp):
        return _record_decoder(typing.cast(type, tp))
    raise TypeError(f"no JSON decoder for {tp!r}")


def _opaque_object(value: Any) -> dict[str, Any]:
    """An object the manager interprets (a spec, a claim): copied in its own key order."""
    if type(value) is not dict:
        raise Invalid(f"expected object, got {describe(value)}")
    return _json_object(value)


def _optional_decoder(tp: Any, args: tuple[Any, ...]) -> Convert:
    others = [a for a in args if a is not type(None)]
    if len(others) != 1 or len(args) != 2:
        raise TypeError(f"only X | None unions are supported, not {tp!r}")
    inner = _decoder(others[0])

    def decode(value: Any) -> Any:
        return None if value is None else inner(value)

    return decode


def _tuple_decoder(inner: Convert) -> Convert:
    def decode(value: Any) -> tuple[Any, ...]:
        if type(value) is not list:
            raise Invalid(f"expected list, got {describe(value)}")
        items = []
        for index, item in enumerate(value):
            try:
                items.append(inner(item))
            except Invalid as bad:
                bad.steps.append(f"[{index}]")
                raise
        return tuple(items)

    return decode


def _dict_decoder(inner: Convert) -> Convert:
    """Records come out sorted by key, as the file lists them: a state iterates the same way whether
    it was just committed or reloaded."""

    def decode(value: Any) -> dict[str, Any]:
        if type(value) is not dict:
            raise Invalid(f"expected object, got {describe(value)}")
        if not all(type(key) is str for key in value):
            key = next(key for key in value if type(key) is not str)
            raise Invalid(f"object keys must be strings, got {describe(key)} {key!r}")
        out = {}
        for key in sorted(value):
            try:
                out[key] = inner(value[key])
            except Invalid as bad:
                bad.steps.append(key_step(key))
                raise
        return out

    return decode


def _field_step(name: str) -> str:
    return f".{name}" if name.isidentifier() else key_step(name)


def _record_decoder(cls: type) -> Convert:
    """A decoder written out as straight-line code for `cls`, the way attrs and cattrs build theirs.

    A loop over the fields with a converter call each made loading a large
    state several times slower; the generated function checks exact types
    inline and calls a converter only for nested or unusual values.
    """
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    env: dict[str, Any] = {
        "Invalid": Invalid, "describe": describe, "refuse": _refuse_keys, "cls": cls,
        "names": frozenset(names), "order": names, "steps": [_field_step(name) for name in names],
        "validate": getattr(cls, "_validate", None),
    }
    lines = [
        "def decode(value):",
        "    if type(value) is not dict:",
        "        raise Invalid('expected object, got ' + describe(value))",
        f"    if len(value) != {len(names)} or not names.issuperset(value):",
        "        refuse(value, order, names)",
        "    at = 0",
        "    try:",
    ]
    for i, f in enumerate(fields(cls)):
        tp = hints[f.name]
        env[f"convert{i}"] = _decoder(tp)
        lines.append(f"        at = {i}")
        if tp in (int, str, bool):
            env[f"type{i}"] = tp
            lines.append(f"        v{i} = value[{f.name!r}]")
            lines.append(f"        if type(v{i}) is not type{i}: v{i} = convert{i}(v{i})")
        else:
            lines.append(f"        v{i} = convert{i}(value[{f.name!r}])")
        if "check" in f.metadata:
            env[f"check{i}"] = f.metadata["check"]
            lines.append(f"        check{i}(v{i})")
    lines += [
        "    except Invalid as bad:",
        "        bad.steps.append(steps[at])",
        "        raise",
        "    record = cls(" + ", ".join(f"{name}=v{i}" for i, name in enumerate(names)) + ")",
        "    if validate is not None:",
        "        validate(record)",
        "    return record",
    ]
    exec(compile("\n".join(lines), f"<decoder of {cls.__qualname__}>", "exec"), env)
    decode: Convert = env["decode"]
    return decode


def _refuse_keys(value: Mapping[Any, Any], order: list[str], names: frozenset[str]) -> None:
    unknown = sorted(str(k) for k in value if k not in names)
    if unknown:
        raise Invalid(f"unknown key (expected one of: {', '.join(order)})", _field_step(unknown[0]))
    missing = next(name for name in order if name not in value)
    raise Invalid("missing", _field_step(missing))


# Encoders: record value -> JSON value. They never refuse: a wrong value is
# passed through untouched, so the strict decoder that validates every commit
# reports it with its path.


def _same(value: Any) -> Any:
    return value


@cache
def _encoder(tp: Any) -> Convert:
    if tp in _PRIMITIVES:
        return _same
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = _encoder(next(a for a in args if a is not type(None)))
        return inner if inner is _same else lambda v: None if v is None else inner(v)
    if origin is tuple:
        return _tuple_encoder(_encoder(args[0]))
    if origin is dict:
        return _dict_encoder(_encoder(args[1]))
    if is_dataclass(tp):
        return _record_encoder(typing.cast(type, tp))
    raise TypeError(f"no JSON encoder for {tp!r}")


def _tuple_encoder(inner: Convert) -> Convert:
    def encode(value: Any) -> Any:
        if not isinstance(value, (tuple, list)):
            return value
        return list(value) if inner is _same else [inner(item) for item in value]

    return encode


def _dict_encoder(inner: Convert) -> Convert:
    def encode(value: Any) -> Any:
        if not isinstance(value, dict) or inner is _same:
            return value
        return {key: inner(item) for key, item in value.items()}

    return encode


def _record_encoder(cls: type) -> Convert:
    hints = typing.get_type_hints(cls)
    plan = [(f.name, _encoder(hints[f.name])) for f in fields(cls)]

    def encode(value: Any) -> Any:
        if not isinstance(value, cls):
            return value
        return {name: convert(getattr(value, name)) for name, convert in plan}

    return encode
