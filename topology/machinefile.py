"""Machine files: a whole box described in a few lines of TOML.

The fake NVML answers from these, so after loading they must say everything
the hardware would report, down to the remote PCI bus id of every NVLink port,
while the file itself stays short enough to write by hand for one's own box
(a GPU template, overrides, link rules). The file is declared once as msgspec
structs (`MachineFile`), which check every value where it is written; the
rules between fields (GPUs named exist, MIG instances fit, ids are unique)
are small functions beside them, and `MachineFile.expand` turns the compact
form into a fully explicit `MachineSpec`. Every mistake names the file and
the field. The format is documented in `docs/machine-files.md`.
"""

from __future__ import annotations

import enum
import re
import sys
import types
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import msgspec
from msgspec import Meta

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

from computegroups.topology.machinefile_model import FileRuleBroken, MachineFile
from computegroups.topology.machinespec import MachineFileError, MachineSpec

__all__ = [
    "MachineFileError", "load_machine_spec", "parse_machine_file", "resolve_machine_file", "simulated_machine_names",
]

MACHINES_DIR = ("computegroups.topology", "machines")


def simulated_machine_names() -> tuple[str, ...]:
    """The machines shipped with the package, for `--simulate NAME`."""
    folder = resources.files(MACHINES_DIR[0]).joinpath(MACHINES_DIR[1])
    return tuple(sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml")))


def resolve_machine_file(name_or_path: str) -> tuple[Path, str]:
    """A shipped name or a path to a file -> (path, label used in messages)."""
    if name_or_path in simulated_machine_names():
        ref = resources.files(MACHINES_DIR[0]).joinpath(MACHINES_DIR[1]).joinpath(f"{name_or_path}.toml")
        return Path(str(ref)), f"{name_or_path}.toml"
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path, str(name_or_path)
    raise MachineFileError(
        f"{name_or_path}: no such simulated machine or machine file; shipped machines: "
        + ", ".join(simulated_machine_names())
    )


def load_machine_spec(name_or_path: str) -> MachineSpec:
    path, label = resolve_machine_file(name_or_path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise MachineFileError(f"{label}: cannot read: {err.strerror or err}") from None
    return parse_machine_file(text, label, default_name=path.stem)


def parse_machine_file(text: str, label: str, default_name: str = "machine") -> MachineSpec:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise MachineFileError(f"{label}: not valid TOML: {err}") from None
    try:
        return msgspec.convert(data, MachineFile).expand(label, default_name)
    except msgspec.ValidationError as err:
        path, problem = _describe(err, data)
        raise MachineFileError(f"{label}: {path}: {problem}") from None
    except FileRuleBroken as err:
        raise MachineFileError(f"{label}: {err.path}: {err.problem}") from None




_TYPE_WORDS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
               "array": "an array", "object": "a table"}
_STEP_RE = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")


def _describe(err: msgspec.ValidationError, data: Any) -> tuple[str, str]:
    """(field path, what was expected) for an error of `msgspec.convert(data, MachineFile)`.

    msgspec says ``Expected `int`, got `str` - at `$.gpus[...].memory_mib` ``:
    the path leaves out dict keys and the words are JSON's. This fills the keys
    in from `data` (`gpus[3].memory_mib`, `nvlink.pairs.0-1`), speaks of
    integers and tables, shows the value given, and uses a constraint's
    `Meta(description=...)` where a pattern alone would say nothing.
    """
    message, _, at = str(err).partition(" - at `")
    path, value, declared = _locate(data, MachineFile, at.rstrip("`"))
    members = _members(declared)
    if m := re.fullmatch(r"Object (missing required|contains unknown) field `(.+)`", message):
        kind, name = m.groups()
        struct = next(t for t, _ in members if _is_struct(t))
        child = f"{path}.{name}" if path else name
        if kind == "missing required":
            field = next(f for f in msgspec.structs.fields(struct) if f.encode_name == name)
            described = _description(_members(field.type))
            return child, "missing" + (f" (expected {described})" if described else "")
        known = ", ".join(sorted(f.encode_name for f in msgspec.structs.fields(struct)))
        return child, f"unknown field (known: {known})"
    if message.startswith("Invalid enum value "):
        choices = next(t for t, _ in members if isinstance(t, type) and issubclass(t, enum.Enum))
        return path, f"expected one of {', '.join(str(c.value) for c in choices)}, got {_spoken(value)}"
    if message.startswith("Expected `"):
        described = _description(members)
        if described:
            return path, f"expected {described}, got {_spoken(value)}"
        expected = re.sub(r"`([^`]+)`", lambda t: _type_words(t.group(1)), message.split(", got `")[0])
        return path, f"e{expected[1:]}, got {_spoken(value)}"
    return path, message


def _locate(data: Any, root: Any, at: str) -> tuple[str, Any, Any]:
    """The path in the file's words, and the value and declared type found there.

    Keys of `[gpus]` read as GPU indices, `gpus[0-3]`, like the per-GPU paths
    of the rules; other tables' keys as TOML writes them, `nvlink.pairs.0-1`.
    """
    path, declared = "", root
    for step in _STEP_RE.finditer(at.removeprefix("$")):
        name, index = step.groups()
        members = [t for t, _ in _members(declared)]
        if name is not None:
            struct = next(t for t in members if _is_struct(t))
            declared = next(f.type for f in msgspec.structs.fields(struct) if f.encode_name == name)
            data = data[name]
            path = f"{path}.{name}" if path else name
        elif index == "...":
            declared = get_args(next(t for t in members if get_origin(t) is dict))[1]
            key = next(k for k, v in data.items() if not _converts(v, declared))
            data = data[key]
            path += f"[{key}]" if path == "gpus" else f".{key}"
        else:
            declared = get_args(next(t for t in members if get_origin(t) is list))[0]
            data = data[int(index)]
            path += f"[{index}]"
    return path, data, declared


def _members(declared: Any) -> list[tuple[Any, tuple[Meta, ...]]]:
    """The types a value may have (None dropped: TOML has no null), each with its constraints."""
    if get_origin(declared) is Annotated:
        base, *extra = get_args(declared)
        metas = tuple(e for e in extra if isinstance(e, Meta))
        return [(t, metas + inner) for t, inner in _members(base)]
    if get_origin(declared) in (Union, types.UnionType):
        return [m for arg in get_args(declared) for m in _members(arg)]
    return [] if declared is type(None) else [(declared, ())]


def _is_struct(declared: Any) -> bool:
    return isinstance(declared, type) and issubclass(declared, msgspec.Struct)


def _converts(value: Any, declared: Any) -> bool:
    try:
        msgspec.convert(value, declared)
    except msgspec.ValidationError:
        return False
    return True


def _description(members: list[tuple[Any, tuple[Meta, ...]]]) -> str | None:
    return next((meta.description for _, metas in members for meta in metas if meta.description), None)


def _type_words(names: str) -> str:
    words = [_TYPE_WORDS.get(n, n) for n in names.split(" | ") if n != "null"]
    return " or ".join(words) if len(words) < 3 else ", ".join(words[:-1]) + " or " + words[-1]


def _spoken(value: Any) -> str:
    """The value as given, or what it is when it would not fit on the line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    if len(text) <= 40 or isinstance(value, str | int | float):
        return text
    return "a table" if isinstance(value, dict) else "an array"
