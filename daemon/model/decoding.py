"""Decoding into the model, with refusals that read like the rest of cgd.

msgspec checks types, ranges and unknown fields as it decodes, and says where
(`Expected `int` >= 1 - at `$.claim.gpus``). People read `claim.gpus: must be
at least 1, got 0`: the path first, then what was expected and what came.
`refusal` rewrites one message into the other, finding the bounds, the enum's
choices and the known fields in the type itself, and the offending value in
the input, so no message repeats a rule the model already states.

The model's own cross-field checks (`__post_init__`) raise `ValueError`s
shaped `"<field path>: <problem>"` (an empty path for the object itself), so
that their path is joined to where msgspec found the object.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, TypeVar, Union

import msgspec
import msgspec.inspect as mi

T = TypeVar("T")

_AT = re.compile(r"^(?P<message>.*?)(?: - at (?P<key>`key` in )?`\$(?P<path>[^`]*)`)?$", re.DOTALL)
_SEGMENT = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_OWN = re.compile(r"^(?P<where>[a-z_][a-z0-9_]*(?:\[\d+\])*(?:\.[a-zA-Z0-9_]+(?:\[\d+\])*)*)?: (?P<problem>.*)$",
                  re.DOTALL)
_NOUNS = {"int": "an integer", "str": "a string", "bool": "true or false", "float": "a number",
          "array": "a list", "object": "an object", "null": "null"}
_MISSING = object()

PATTERN_PROBLEMS: dict[str, str] = {}
"""Regex -> what a value failing it is not, filled by the modules that define the patterns."""


class ModelError(ValueError):
    """Input the model refused; `str()` is `path: problem`, the path under the caller's root."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}" if path else problem)


def convert(data: Any, type_: type[T], root: str = "", empty: str = "body") -> T:
    """Check already-parsed input (TOML, JSON, CLI values) against the model."""
    try:
        return msgspec.convert(data, type_)
    except msgspec.ValidationError as exc:
        raise refusal(exc, type_, data, root, empty) from None


def decode_json(raw: bytes, type_: type[T], root: str = "", empty: str = "body") -> T:
    """Decode a JSON body straight into the model (a syntax error is the caller's to report)."""
    try:
        return msgspec.json.decode(raw, type=type_)
    except msgspec.ValidationError as exc:
        try:
            data: Any = json.loads(raw)
        except ValueError:
            data = _MISSING
        raise refusal(exc, type_, data, root, empty) from None


def to_plain(value: Any) -> Any:
    """The JSON form as Python objects (lists, not the tuples `msgspec.to_builtins` keeps)."""
    return msgspec.json.decode(msgspec.json.encode(value))


def refusal(exc: msgspec.ValidationError, type_: Any, data: Any, root: str = "", empty: str = "body") -> ModelError:
    """The one-line refusal for a msgspec error: `root.path: problem`."""
    match = _AT.match(str(exc))
    assert match is not None
    message = match.group("message")
    segments: list[str | int] = []
    for name, index in _SEGMENT.findall(match.group("path") or ""):
        segments.append(name if name else (int(index) if index != "..." else "..."))
    if match.group("key"):
        segments.append("...")
    node = _Walk(type_, data)
    for segment in segments:
        node = node.step(segment)
    where, problem = node.explain(message)
    path = (node.path + where).removeprefix(".")
    full = f"{root}{'.' if root and path and not path.startswith('[') else ''}{path}"
    return ModelError(full or empty, problem)


class _Walk:
    """The type and the input value at a point of the path, followed together."""

    def __init__(self, type_: Any, data: Any) -> None:
        self.info: mi.Type | None = mi.type_info(type_)
        self.data = data
        self.path = ""

    def step(self, segment: str | int) -> _Walk:
        info = self._unwrap(self.data)
        data = self.data
        if segment == "..." and isinstance(info, mi.DictType) and isinstance(data, dict):
            key = self._bad_key(info, data)
            self.path += f".{key}" if key is not None else "[...]"
            self.info, self.data = info.value_type, data.get(key, _MISSING) if key is not None else _MISSING
            return self
        if isinstance(segment, int):
            self.path += f"[{segment}]"
            item = getattr(info, "item_type", None)
            if isinstance(info, mi.TupleType):
                item = info.item_types[segment] if segment < len(info.item_types) else None
            self.info = item
            self.data = data[segment] if isinstance(data, list) and segment < len(data) else _MISSING
            return self
        self.path += f".{segment}" if self.path else str(segment)
        field = self._field(info, str(segment))
        self.info = field.type if field is not None else None
        self.data = data.get(segment, _MISSING) if isinstance(data, dict) else _MISSING
        return self

    def explain(self, message: str) -> tuple[str, str]:
        """(the extra path below this point, the problem) for one msgspec message."""
        got = "" if self.data is _MISSING else f", got {_show(self.data)}"
        info = self._unwrap(self.data)
        if m := re.fullmatch(r"Object contains unknown field `(.+)`", message):
            known = self._known(info)
            return _sub(m.group(1)), "unknown field" + (f" (known: {', '.join(known)})" if known else "")
        if m := re.fullmatch(r"Object missing required field `(.+)`", message):
            return _sub(m.group(1)), "required"
        if m := re.fullmatch(r"Expected `([^`]+)`, got `[^`]+`", message):
            expected = " or ".join(_NOUNS.get(t, t) for t in m.group(1).split(" | ") if t != "null")
            return "", f"expected {expected}{got}"
        if m := re.fullmatch(r"Invalid enum value .*", message):
            choices = self._choices()
            return "", (f"must be one of {', '.join(choices)}{got}" if choices else message)
        if m := re.fullmatch(r"Expected `str` matching regex '(.*)'", message):
            # msgspec shows the pattern as its repr, escapes doubled.
            problem = next((p for regex, p in PATTERN_PROBLEMS.items() if repr(regex)[1:-1] == m.group(1)),
                           f"must match the pattern {m.group(1)}")
            return "", problem.format(value=_show(self.data))
        if re.fullmatch(r"Expected `(str|array|object)` of length (>=|<=) \d+", message):
            lo, hi = getattr(info, "min_length", None), getattr(info, "max_length", None)
            if lo == 1 and hi is None:
                return "", "may not be empty"
            return "", f"length must be between {lo or 0} and {hi}" if hi is not None else f"needs at least {lo} items"
        if re.fullmatch(r"Expected `(int|float)` (>=|<=|>|<) \S+", message):
            lo, hi = getattr(info, "ge", None), getattr(info, "le", None)
            if lo is not None and hi is not None:
                return "", f"must be between {lo:g} and {hi:g}{got}"
            return "", (f"must be at least {lo:g}{got}" if lo is not None else f"must be at most {hi:g}{got}")
        if m := _OWN.match(message):
            where = m.group("where") or ""
            # `__post_init__` names fields as Python does; say them as the input does.
            head = where.split(".", 1)[0].split("[", 1)[0]
            field = self._field_by_name(info, head)
            if field is not None:
                where = field.encode_name + where[len(head):]
            return _sub(where), m.group("problem")
        return "", message[:1].lower() + message[1:]

    def _unwrap(self, data: Any) -> mi.Type | None:
        """The member of a union (or optional) the input value is meant for."""
        info = self.info
        while isinstance(info, (mi.UnionType, mi.Metadata)):
            if isinstance(info, mi.Metadata):
                info = info.type
                continue
            members = [t for t in info.types if not isinstance(t, mi.NoneType)]
            wanted = (mi.StructType, mi.DictType) if isinstance(data, dict) else \
                (mi.ListType, mi.VarTupleType, mi.TupleType) if isinstance(data, list) else ()
            info = next((t for t in members if isinstance(t, wanted)), members[0] if members else None)
            if isinstance(data, (int, float)) and not isinstance(data, bool):
                info = next((t for t in members if isinstance(t, (mi.IntType, mi.FloatType))), info)
            elif isinstance(data, str):
                info = next((t for t in members if isinstance(t, (mi.StrType, mi.EnumType))), info)
        return info

    def _choices(self) -> list[str]:
        info = self.info
        found: list[str] = []
        stack = [info]
        while stack:
            item = stack.pop()
            if isinstance(item, mi.UnionType):
                stack.extend(reversed(item.types))
            elif isinstance(item, mi.Metadata):
                stack.append(item.type)
            elif isinstance(item, mi.EnumType):
                found += [str(m.value) for m in item.cls]
            elif isinstance(item, mi.LiteralType):
                found += [str(v) for v in item.values]
        return found

    @staticmethod
    def _field(info: mi.Type | None, name: str) -> mi.Field | None:
        if isinstance(info, mi.StructType):
            return next((f for f in info.fields if f.encode_name == name), None)
        return None

    @staticmethod
    def _field_by_name(info: mi.Type | None, name: str) -> mi.Field | None:
        if isinstance(info, mi.StructType):
            return next((f for f in info.fields if f.name == name), None)
        return None

    @staticmethod
    def _known(info: mi.Type | None) -> list[str]:
        return [f.encode_name for f in info.fields] if isinstance(info, mi.StructType) else []

    @staticmethod
    def _bad_key(info: mi.DictType, data: dict[Any, Any]) -> Any:
        """msgspec says `[...]` for a dict entry; name the first entry that fails."""
        key_type = mi_to_type(info.key_type)
        value_type = mi_to_type(info.value_type)
        for key, value in data.items():
            for item, type_ in ((key, key_type), (value, value_type)):
                try:
                    msgspec.convert(item, type_)
                except (msgspec.ValidationError, TypeError):
                    return key
        return None


def mi_to_type(info: mi.Type) -> Any:
    """The checkable type an inspected type came from, for the kinds that hold dict entries here."""
    if isinstance(info, mi.Metadata):
        return mi_to_type(info.type)
    if isinstance(info, mi.UnionType):
        members = tuple(mi_to_type(t) for t in info.types)
        return Union[members]  # noqa: UP007 (a runtime-built union)
    if isinstance(info, (mi.StructType, mi.EnumType, mi.DataclassType)):
        return info.cls
    if isinstance(info, mi.NoneType):
        return None
    meta = {key: getattr(info, key) for key in ("ge", "gt", "le", "lt", "min_length", "max_length", "pattern")
            if getattr(info, key, None) is not None}
    base: Any = Any
    if isinstance(info, mi.ListType):
        base = list[mi_to_type(info.item_type)]  # type: ignore[misc]
    elif isinstance(info, mi.VarTupleType):
        base = tuple[mi_to_type(info.item_type), ...]  # type: ignore[misc]
    elif isinstance(info, mi.DictType):
        base = dict[mi_to_type(info.key_type), mi_to_type(info.value_type)]  # type: ignore[misc]
    elif isinstance(info, mi.IntType):
        base = int
    elif isinstance(info, mi.FloatType):
        base = float
    elif isinstance(info, mi.BoolType):
        base = bool
    elif isinstance(info, mi.StrType):
        base = str
    return Annotated[base, msgspec.Meta(**meta)] if meta else base


def _sub(where: str) -> str:
    if not where:
        return ""
    return where if where.startswith("[") else f".{where}"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
