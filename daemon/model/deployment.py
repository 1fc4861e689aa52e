"""A deployment file, decoded once: the one-box form of a Grove PodCliqueSet.

The file (TOML, sent by `cgctl apply` as JSON) declares a set of components,
the scaling groups that replicate some of them together, named claim
templates, and the sharing entries that turn claims into compute groups at
the set, scaling-group and component levels. `parse` decodes it into a
`DeploymentFile` (msgspec: shapes, types and ranges from the annotations,
the rules between entries in `__post_init__`), refusing a malformed file
with `<file>: <path>: <problem>`; everything the daemon later decides
trusts a `DeploymentSpec`.

A spec also carries the replica counts as scaled (`sizes`, one entry per set
replica): `cgctl scale` changes them without touching the file's counts, so
that a set replica added later starts from the file, as a new PodCliqueSet
replica starts from its template. `DeploymentSpec` is exactly what
`DeploymentRecord.spec` keeps: `{"file": ..., "sizes": [...]}`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias

import msgspec
from msgspec import UNSET, Meta, UnsetType
from msgspec.structs import replace

from computegroups.daemon.model.claims import Claim, MemorySize, Name, Percent
from computegroups.daemon.model.decoding import PATTERN_PROBLEMS, ModelError, convert, to_plain
from computegroups.daemon.model.enums import CpuBind, RestartMode
from computegroups.daemon.model.requests import (
    _NO_NUL,
    MAX_REPLICAS,
    ComponentRequest,
    EnvName,
    RestartSpec,
    Scope,
    Seconds,
    Text,
    TimeLimit,
)

MAX_SOURCE = 4096
MAX_IMAGE = 4096
_IMAGE = r"^\S+$"
PATTERN_PROBLEMS[_IMAGE] = "expected a container image reference (no spaces), got {value}"
Count = Annotated[int, Meta(ge=0, le=MAX_REPLICAS)]
Names = tuple[Name, ...]


class DeploymentError(ValueError):
    """A deployment is malformed or cannot be built; the message is `<file>: <path>: <problem>`."""

    def __init__(self, path: str, problem: str, source: str | None = None) -> None:
        self.path = path
        self.problem = problem
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{path}: {problem}" if path else f"{where}{problem}")

    def within(self, source: str | None) -> DeploymentError:
        """The same error, naming the file it came from."""
        return DeploymentError(self.path, self.problem, source)


class ApplyRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/deployments`: the file as JSON, and the path it was read from (for messages).

    The file is decoded by `parse`, so that its refusals name the file.
    """

    spec: dict[str, Any]
    source: Annotated[str, Meta(min_length=1, max_length=MAX_SOURCE, pattern=_NO_NUL)] | None = None
    included: dict[Annotated[str, Meta(min_length=1, max_length=MAX_SOURCE, pattern=_NO_NUL)], Any] = {}
    """The files the spec's `include` names, as the client read them (cgd reads no file on a
    caller's behalf): each path as written in `include`, to its content."""


class DeploymentScaleRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/deployments/<name>/scale`: the set (target None), a scaling group or a component."""

    target: Name | None = None
    replicas: Count


class ClaimSpec(Claim, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """A named claim of the file: a `Claim` spelled like cgctl's flags (`memory`, `compute`)."""

    name: Name
    memory_mib: MemorySize | None = msgspec.field(default=None, name="memory")
    compute_pct: Percent | None = msgspec.field(default=None, name="compute")

    @property
    def claim(self) -> Claim:
        fields = {f: getattr(self, f) for f in Claim.__struct_fields__}
        return Claim(**fields)

    def to_dict(self) -> dict[str, Any]:
        """The file's spelling, so stored specs read like the file."""
        out: dict[str, Any] = {"name": self.name, **{k: v for k, v in to_plain(self).items() if k != "name"}}
        return out


def _filter_lists(flt: GroupFilter) -> dict[str, Names | None]:
    return {f: getattr(flt, f) for f in flt.__struct_fields__}


class GroupFilter(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """The children a scaling group's sharing entry reaches: some of its components."""

    components: Names | None = None

    def __post_init__(self) -> None:
        lists = _filter_lists(self)
        if not any(lists.values()):
            raise ValueError(": a filter must name at least one child (leave the filter out to target every child)")
        for key, names in lists.items():
            _unique(names or (), key, "name")


class SetFilter(GroupFilter, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """The children a set-level sharing entry reaches: components and/or scaling groups."""

    scaling_groups: Names | None = None


class SharingSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """One sharing entry of a scaling group: a claim, a scope, and an optional filter.

    Without a filter the entry targets every child.
    """

    claim: Name
    scope: Scope
    filter: GroupFilter | None = None

    @property
    def components(self) -> Names | None:
        return self.filter.components if self.filter is not None else None

    @property
    def scaling_groups(self) -> Names | None:
        return getattr(self.filter, "scaling_groups", None)

    @property
    def filtered(self) -> bool:
        return self.filter is not None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = to_plain(self)
        return out


class SetSharing(SharingSpec, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """A set-level entry: its filter may also name scaling groups."""

    filter: SetFilter | None = None


class ComponentSharing(SharingSpec, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """A component-level entry: always the component's own replicas."""

    def __post_init__(self) -> None:
        if self.filter is not None:
            raise ValueError("filter: component-level sharing has no filter: "
                             "it applies to the component's own replicas")


# A shadow may not give `replicas` or `sharing` at all, so the wire must tell
# "left out" (UNSET) from the default; `__post_init__` fills the default in,
# and code past decoding sees the narrow type mypy is told about.
if TYPE_CHECKING:
    _CountIn: TypeAlias = int
    _SharingIn: TypeAlias = tuple[SharingSpec, ...]
else:
    _CountIn = Count | UnsetType
    _SharingIn = tuple[ComponentSharing, ...] | UnsetType
_LEFT_OUT: Any = UNSET


class ComponentTemplate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A component of the file, instantiated once per set replica (and scaling-group replica)."""

    name: Name
    command: Annotated[tuple[Text, ...], Meta(min_length=1)] | None = None
    env: dict[EnvName, Text] = {}
    cwd: Annotated[str, Meta(min_length=1, pattern=_NO_NUL)] | None = None
    replicas: _CountIn = _LEFT_OUT
    restart: RestartSpec = RestartSpec()
    stop_timeout_s: Seconds = 10.0
    sharing: _SharingIn = _LEFT_OUT
    shadow_of: Name | None = None
    cpu_bind: CpuBind | None = None
    image: Annotated[str, Meta(min_length=1, max_length=MAX_IMAGE, pattern=_IMAGE)] | None = None
    """The container image it runs on Kubernetes (`cgctl render kubernetes`, `cgctl --kubernetes apply`,
    where `--image` is the default for components without one); cgd runs `command` on the host."""
    time_limit_s: TimeLimit | None = None
    """How long each instance may run from its creation: cgd stops it then (state `timeout`, not
    restarted), as for `cgctl allocate --time-limit`; on Kubernetes its pods' `activeDeadlineSeconds`."""

    def __post_init__(self) -> None:
        set_ = msgspec.structs.force_setattr
        if self.shadow_of is not None:
            for key, why in (("replicas", "a shadow has one replica per replica of its primary"),
                             ("sharing", "a shadow uses its primary's groups")):
                if getattr(self, key) is not UNSET:
                    raise ValueError(f"{key}: not allowed with shadow_of: {why}")
        for key, default in (("replicas", 1), ("sharing", ())):
            if getattr(self, key) is UNSET:
                set_(self, key, default)
        if self.cwd is not None and not os.path.isabs(self.cwd):
            raise ValueError(f"cwd: {self.cwd!r} is not an absolute path")
        _unique([e.claim for e in self.sharing], "sharing", "claim", ".claim", " in this list")
        self.request(self.name, None)  # the process rules a component request also meets

    def request(self, path: str, shadow_of: str | None) -> ComponentRequest:
        """The component request of one instance, the form the workers are built from."""
        restart = self.restart
        if restart.policy is None:  # a deployment runs services
            restart = msgspec.structs.replace(restart, policy=RestartMode.ALWAYS)
        return ComponentRequest(name=path, shadow_of=shadow_of, command=self.command, env=dict(self.env),
                                cwd=self.cwd, restart=restart, stop_timeout_s=self.stop_timeout_s,
                                time_limit_s=self.time_limit_s, cpu_bind=self.cpu_bind)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.command is not None:
            out["command"] = list(self.command)
        if self.env:
            out["env"] = dict(self.env)
        if self.cwd is not None:
            out["cwd"] = self.cwd
        if self.shadow_of is None:
            out["replicas"] = self.replicas
        else:
            out["shadow_of"] = self.shadow_of
        out["restart"] = {k: v for k, v in to_plain(self.restart).items() if v is not None}
        out["stop_timeout_s"] = self.stop_timeout_s
        if self.sharing:
            out["sharing"] = [s.to_dict() for s in self.sharing]
        if self.cpu_bind is not None:
            out["cpu_bind"] = str(self.cpu_bind)
        if self.image is not None:
            out["image"] = self.image
        if self.time_limit_s is not None:
            out["time_limit_s"] = self.time_limit_s
        return out


class ScalingGroupSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Name
    components: Names = ()
    replicas: Count = 1
    sharing: tuple[SharingSpec, ...] = ()

    def __post_init__(self) -> None:
        if not self.components:
            raise ValueError("components: a scaling group needs at least one component")
        _unique(self.components, "components", "component")
        _unique([e.claim for e in self.sharing], "sharing", "claim", ".claim", " in this list")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = to_plain(self)
        return out


class ReplicaSizes(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The counts inside one set replica: replicas of each scaling group, and
    of each (non-shadow) component instance, in or out of scaling groups."""

    scaling_groups: dict[str, int]
    components: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"scaling_groups": dict(self.scaling_groups), "components": dict(self.components)}


class DeploymentFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The file itself; the checks between its entries run once it is decoded."""

    name: Name
    replicas: Count = 1
    claims: tuple[ClaimSpec, ...] = ()
    components: tuple[ComponentTemplate, ...] = ()
    scaling_groups: tuple[ScalingGroupSpec, ...] = ()
    sharing: tuple[SetSharing, ...] = ()

    def __post_init__(self) -> None:
        _check_references(self)

    def to_dict(self) -> dict[str, Any]:
        """The canonical form of the file (defaults spelled out)."""
        return {
            "name": self.name, "replicas": self.replicas,
            "claims": [c.to_dict() for c in self.claims],
            "components": [c.to_dict() for c in self.components],
            "scaling_groups": [g.to_dict() for g in self.scaling_groups],
            "sharing": [s.to_dict() for s in self.sharing],
        }


class IncludedClaims(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How many of a deployment's claims one included file gave (they come first, in `include` order)."""

    path: Annotated[str, Meta(min_length=1, max_length=MAX_SOURCE, pattern=_NO_NUL)]
    count: Annotated[int, Meta(ge=0)]


class DeploymentSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """A deployment as applied and scaled: what `DeploymentRecord.spec` keeps."""

    file: DeploymentFile
    sizes: tuple[ReplicaSizes, ...]
    included: tuple[IncludedClaims, ...] = ()
    """Where the merged `claims` came from, so that a message about one names its own file and index."""

    @property
    def name(self) -> str:
        return self.file.name

    @property
    def replicas(self) -> int:
        return self.file.replicas

    @property
    def claims(self) -> tuple[ClaimSpec, ...]:
        return self.file.claims

    @property
    def components(self) -> tuple[ComponentTemplate, ...]:
        return self.file.components

    @property
    def scaling_groups(self) -> tuple[ScalingGroupSpec, ...]:
        return self.file.scaling_groups

    @property
    def sharing(self) -> tuple[SetSharing, ...]:
        return self.file.sharing

    def claim(self, name: str) -> Claim:
        return next(c.claim for c in self.claims if c.name == name)

    def component(self, name: str) -> ComponentTemplate:
        return next(c for c in self.components if c.name == name)

    def group_of(self, component: str) -> str | None:
        """The scaling group a component belongs to; None for a standalone one."""
        return next((g.name for g in self.scaling_groups if component in g.components), None)

    def file_sizes(self) -> ReplicaSizes:
        """The counts a fresh set replica starts with: the file's."""
        return _file_sizes(self.file)

    def locate(self, path: str, source: str | None) -> tuple[str | None, str]:
        """The file and path a message about `path` (of the merged file `source`) should name:
        `claims[3].cpus` may be an included file's `claims[1].cpus`."""
        return _locate(self.included, path, source)


    def scaled(self, target: str | None, replicas: int) -> DeploymentSpec:
        """The spec after `cgctl scale`: the set (target None), a scaling group
        or a component, in every set replica. Raises `LookupError` for an
        unknown target and `DeploymentError` for a shadow."""
        if target is None:
            sizes = self.sizes[:replicas] + (self.file_sizes(),) * max(0, replicas - len(self.sizes))
            return replace(self, sizes=sizes)
        if any(g.name == target for g in self.scaling_groups):
            key = "scaling_groups"
        elif any(c.name == target for c in self.components):
            shadow_of = self.component(target).shadow_of
            if shadow_of is not None:
                raise DeploymentError("target", f"{target!r} is a shadow of {shadow_of!r}: scale {shadow_of!r}")
            key = "components"
        else:
            raise LookupError(target)
        return replace(self, sizes=tuple(
            replace(s, **{key: {**getattr(s, key), target: replicas}}) for s in self.sizes))

    def carry_sizes(self, old: DeploymentSpec) -> DeploymentSpec:
        """Re-applying a file keeps the counts `cgctl scale` set, except where
        the file's own count changed since the last apply (kubectl's
        last-applied rule): the file wins only for what it changes."""
        n = self.replicas if self.replicas != old.replicas else len(old.sizes)
        fresh = self.file_sizes()
        old_file = old.file_sizes()
        sizes = []
        for i in range(n):
            before = old.sizes[i] if i < len(old.sizes) else None
            counts: dict[str, dict[str, int]] = {}
            for key in ("scaling_groups", "components"):
                mine, theirs = getattr(fresh, key), getattr(old_file, key)
                scaled = getattr(before, key) if before is not None else {}
                counts[key] = {
                    name: value if name not in scaled or theirs.get(name) != value else scaled[name]
                    for name, value in mine.items()
                }
            sizes.append(ReplicaSizes(**counts))
        return replace(self, sizes=tuple(sizes))

    def file_dict(self) -> dict[str, Any]:
        """The canonical form of the file (defaults spelled out)."""
        return self.file.to_dict()

    def to_dict(self) -> dict[str, Any]:
        """What `DeploymentRecord.spec` keeps: the file, the counts as scaled, and where its claims came from."""
        out: dict[str, Any] = {"file": self.file_dict(), "sizes": [s.to_dict() for s in self.sizes]}
        if self.included:
            out["included"] = [{"path": part.path, "count": part.count} for part in self.included]
        return out

    @classmethod
    def from_dict(cls, data: Any) -> DeploymentSpec:
        """A stored spec; it was checked when applied, and is checked again on the way in."""
        return _decode(data, cls, None)


_CLAIM_PATH = re.compile(r"^claims\[(\d+)\](.*)$")


def _locate(included: tuple[IncludedClaims, ...], path: str, source: str | None) -> tuple[str | None, str]:
    match = _CLAIM_PATH.match(path)
    if match is None:
        return source, path
    index = int(match.group(1))
    for part in included:
        if index < part.count:
            return part.path, f"claims[{index}]{match.group(2)}"
        index -= part.count
    return source, f"claims[{index}]{match.group(2)}"


def parse(data: Any, source: str | None = None, included: dict[str, Any] | None = None) -> DeploymentSpec:
    """Decode a deployment file; refusals name the file, the path and the problem.

    `include = ["claims/gpu.toml"]` takes the `[[claims]]` of other files (as
    Grove references external ResourceClaimTemplates): their claims come
    before the file's own, in the order listed, and `included` holds their
    content, read by the client.
    """
    parts: tuple[IncludedClaims, ...] = ()
    if isinstance(data, dict) and "include" in data:
        data, parts = _with_included(data, source, included or {})
    elif included:
        raise DeploymentError("include", f"{', '.join(sorted(included))}: sent, but the file includes nothing",
                              source)
    try:
        file = _decode(data, DeploymentFile, source)
    except DeploymentError as exc:
        where, path = _locate(parts, exc.path, source)
        raise DeploymentError(path, exc.problem, where) from None
    return DeploymentSpec(file=file, sizes=(_file_sizes(file),) * file.replicas, included=parts)


class IncludedFile(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What an included file may hold: claims, nothing else."""

    claims: tuple[ClaimSpec, ...] = ()


def _with_included(data: dict[str, Any], source: str | None,
                   included: dict[str, Any]) -> tuple[dict[str, Any], tuple[IncludedClaims, ...]]:
    paths = data["include"]
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        raise DeploymentError("include", "expected a list of file paths", source)
    if len(set(paths)) != len(paths):
        raise DeploymentError("include", "a file is listed twice", source)
    unsent = sorted(set(included) - set(paths))
    if unsent:
        raise DeploymentError("include", f"{unsent[0]}: sent, but not listed in include", source)
    claims: list[Any] = []
    parts: list[IncludedClaims] = []
    defined: dict[str, str] = {}
    for i, path in enumerate(paths):
        if path not in included:
            raise DeploymentError(f"include[{i}]", f"{path}: its content was not sent (cgctl apply reads it)",
                                  source)
        content = included[path]
        if isinstance(content, dict) and "include" in content:
            raise DeploymentError("include", "an included file includes no other file", path)
        _decode(content, IncludedFile, path)
        for claim in content.get("claims", []):
            name = claim["name"]
            if name in defined:
                raise DeploymentError("claims", f"claim {name!r} is defined in {defined[name]} and in {path}",
                                      source)
            defined[name] = path
            claims.append(claim)
        parts.append(IncludedClaims(path, len(content.get("claims", []))))
    own = data.get("claims", [])
    for n, claim in enumerate(own if isinstance(own, list) else []):
        name = claim.get("name") if isinstance(claim, dict) else None
        if name in defined:
            raise DeploymentError(f"claims[{n}].name", f"claim {name!r} is defined in {defined[name]} too", source)
    return {**{k: v for k, v in data.items() if k != "include"}, "claims": [*claims, *own]}, tuple(parts)


def _decode(data: Any, type_: Any, source: str | None) -> Any:
    try:
        return convert(data, type_, empty="")
    except ModelError as exc:
        raise DeploymentError(exc.path, exc.problem, source) from None


def _file_sizes(file: DeploymentFile) -> ReplicaSizes:
    return ReplicaSizes(
        scaling_groups={g.name: g.replicas for g in file.scaling_groups},
        components={c.name: c.replicas for c in file.components if c.shadow_of is None},
    )


def check_immutable(old: DeploymentSpec, new: DeploymentSpec, source: str | None = None) -> None:
    """Claims and sharing are fixed once applied: groups already placed (and
    the processes that use them) must not change under a running deployment."""
    pairs = [("claims", [c.to_dict() for c in old.claims], [c.to_dict() for c in new.claims]),
             ("sharing", [e.to_dict() for e in old.sharing], [e.to_dict() for e in new.sharing])]
    for kind in ("scaling_groups", "components"):
        before = {item.name: item for item in getattr(old, kind)}
        pairs += [(f"{kind}[{i}].sharing", [e.to_dict() for e in before[item.name].sharing],
                   [e.to_dict() for e in item.sharing])
                  for i, item in enumerate(getattr(new, kind)) if item.name in before]
    for path, old_list, new_list in pairs:
        changed = _first_difference(path, old_list, new_list)
        if changed:
            where, changed = new.locate(changed, source)
            raise DeploymentError("", f"field is immutable: {changed} "
                                      "(delete the deployment and apply the file again to change it)", where)


def _first_difference(path: str, old: Any, new: Any) -> str | None:
    """The deepest path where two JSON values first differ."""
    if old == new:
        return None
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        pairs = enumerate(zip(old, new, strict=True))
        return next(p for i, (a, b) in pairs if (p := _first_difference(f"{path}[{i}]", a, b)))
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            if key not in old or key not in new:
                return f"{path}.{key}"
            found = _first_difference(f"{path}.{key}", old[key], new[key])
            if found:
                return found
    return path


def _check_references(f: DeploymentFile) -> None:
    """The rules between entries: unique names, names that exist, shadows beside their primaries."""
    _unique([c.name for c in f.claims], "claims", "claim", ".name")
    if not f.components:
        raise ValueError("components: a deployment needs at least one component")
    _unique([c.name for c in f.components], "components", "component", ".name")
    _unique([g.name for g in f.scaling_groups], "scaling_groups", "scaling group", ".name")
    claims = {c.name for c in f.claims}
    components = {c.name: c for c in f.components}
    groups = {g.name for g in f.scaling_groups}
    group_of: dict[str, str] = {}
    for i, g in enumerate(f.scaling_groups):
        if g.name in components:
            raise ValueError(f"scaling_groups[{i}].name: {g.name!r} is also a component: "
                             "a scaling group needs a name of its own")
        for j, member in enumerate(g.components):
            where = f"scaling_groups[{i}].components[{j}]"
            if member not in components:
                raise ValueError(f"{where}: no component named {member!r} in this file")
            if member in group_of:
                raise ValueError(f"{where}: {member!r} is already in scaling group {group_of[member]!r}")
            group_of[member] = g.name
    for i, c in enumerate(f.components):
        if c.shadow_of is not None:
            _check_shadow(c, f"components[{i}].shadow_of", components, group_of)
    shadows = {c.name: c.shadow_of for c in f.components if c.shadow_of is not None}
    entries: list[tuple[str, SharingSpec, ScalingGroupSpec | None]] = []
    for i, g in enumerate(f.scaling_groups):
        entries += [(f"scaling_groups[{i}].sharing[{j}]", e, g) for j, e in enumerate(g.sharing)]
    entries += [(f"components[{i}].sharing[{j}]", e, None) for i, c in enumerate(f.components)
                for j, e in enumerate(c.sharing)]
    entries += [(f"sharing[{j}]", e, None) for j, e in enumerate(f.sharing)]
    for path, entry, group in entries:
        if entry.claim not in claims:
            raise ValueError(f"{path}.claim: no claim named {entry.claim!r} in [[claims]]")
        _check_filter(entry, path, group, set(components), shadows, groups)
    _unique([e.claim for e in f.sharing], "sharing", "claim", ".claim", " in this list")


def _check_shadow(c: ComponentTemplate, where: str, components: dict[str, ComponentTemplate],
                  group_of: dict[str, str]) -> None:
    primary = c.shadow_of
    if primary == c.name:
        raise ValueError(f"{where}: a component cannot be its own shadow")
    if primary not in components:
        raise ValueError(f"{where}: no component named {primary!r} in this file")
    if group_of.get(primary) != group_of.get(c.name):
        raise ValueError(f"{where}: {c.name!r} and {primary!r} must be in the same scaling group "
                         "(or both outside any): a shadow lives beside its primary")
    target = components[primary].shadow_of
    if target is not None:
        raise ValueError(f"{where}: {primary!r} is itself a shadow: name its primary {target!r}")


def _check_filter(entry: SharingSpec, path: str, group: ScalingGroupSpec | None, components: set[str],
                  shadows: dict[str, str], groups: set[str]) -> None:
    """Names in a filter exist where the filter looks, and none is a shadow
    (a shadow always takes exactly its primary's groups)."""
    for k, child in enumerate(entry.components or ()):
        where = f"{path}.filter.components[{k}]"
        if group is not None and child not in group.components:
            raise ValueError(f"{where}: {child!r} is not a component of scaling group {group.name!r}")
        if child not in components:
            raise ValueError(f"{where}: no component named {child!r} in this file")
        if child in shadows:
            raise ValueError(f"{where}: {child!r} is a shadow of {shadows[child]!r}: it uses its primary's groups")
    for k, child in enumerate(entry.scaling_groups or ()):
        if child not in groups:
            raise ValueError(f"{path}.filter.scaling_groups[{k}]: no scaling group named {child!r}")


def _unique(names: Iterable[str], path: str, what: str, suffix: str = "", scope: str = "") -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise ValueError(f"{path}[{i}]{suffix}: duplicate {what} {name!r}{scope}")
        seen.add(name)
