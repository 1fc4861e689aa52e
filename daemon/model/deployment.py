"""A deployment file, checked once: the one-box form of a Grove PodCliqueSet.

The file (TOML, sent by `cgctl apply` as JSON) declares a set of components,
the scaling groups that replicate some of them together, named claim
templates, and the sharing entries that turn claims into compute groups at
the set, scaling-group and component levels. Everything the daemon later
decides trusts a `DeploymentSpec`, because `parse` refused every malformed
file with `<file>: <path>: <problem>`.

A spec also carries the replica counts as scaled (`sizes`, one entry per set
replica): `cgctl scale` changes them without touching the file's counts, so
that a set replica added later starts from the file, as a new PodCliqueSet
replica starts from its template.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Annotated, Any

import msgspec
from computegroups.daemon.model.claims import Claim, ClaimError, Name
from computegroups.daemon.model.requests import (
    _NO_NUL,
    MAX_REPLICAS,
    NAME_RE,
    SCOPES,
    ComponentRequest,
    RequestError,
    RestartSpec,
    parse_component,
)
from msgspec import Meta

MAX_SOURCE = 4096

# The file says `memory` and `compute` like cgctl's flags; a Claim says memory_mib and compute_pct.
_CLAIM_KEYS = {"memory": "memory_mib", "compute": "compute_pct"}
_FILE_KEYS = {v: k for k, v in _CLAIM_KEYS.items()}
_CLAIM_FIELDS = ("name", "gpus", "memory", "compute", "mig", "distinct", "strategy", "colocate",
                 "exclusive", "pool", "gpu_ids", "priority", "allow_busy", "affinity", "anti_affinity")
_TOP_KEYS = ("name", "replicas", "claims", "components", "scaling_groups", "sharing")
_COMPONENT_KEYS = ("name", "command", "env", "cwd", "replicas", "restart", "stop_timeout_s",
                   "sharing", "shadow_of")
_GROUP_KEYS = ("name", "components", "replicas", "sharing")


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
    """`POST /v1/deployments`: the file as JSON, and the path it was read from (for messages)."""

    spec: dict[str, Any]
    source: Annotated[str, Meta(min_length=1, max_length=MAX_SOURCE, pattern=_NO_NUL)] | None = None


class DeploymentScaleRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/deployments/<name>/scale`: the set (target None), a scaling group or a component."""

    target: Name | None = None
    replicas: Annotated[int, Meta(ge=0, le=MAX_REPLICAS)]


@dataclass(frozen=True)
class ClaimSpec:
    name: str
    claim: Claim

    def to_dict(self) -> dict[str, Any]:
        """The file's spelling (`memory`, `compute`), so stored specs read like the file."""
        return {"name": self.name, **{_FILE_KEYS.get(k, k): v for k, v in self.claim.to_dict().items()}}


@dataclass(frozen=True)
class SharingSpec:
    """One sharing entry: a claim, a scope, and (set and scaling-group levels) an optional filter.

    `components`/`scaling_groups` are None when the entry has no filter: it
    then targets every child.
    """

    claim: str
    scope: str
    components: tuple[str, ...] | None = None
    scaling_groups: tuple[str, ...] | None = None

    @property
    def filtered(self) -> bool:
        return self.components is not None or self.scaling_groups is not None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"claim": self.claim, "scope": self.scope}
        if self.filtered:
            out["filter"] = {k: list(v) for k, v in (("components", self.components),
                                                      ("scaling_groups", self.scaling_groups)) if v is not None}
        return out


@dataclass(frozen=True)
class ComponentSpec:
    name: str
    command: tuple[str, ...] | None
    env: Mapping[str, str]
    cwd: str | None
    replicas: int
    restart: RestartSpec
    stop_timeout_s: float
    sharing: tuple[SharingSpec, ...]
    shadow_of: str | None

    def request(self, path: str, shadow_of: str | None) -> ComponentRequest:
        """The component request of one instance, the form the workers are built from."""
        return ComponentRequest(name=path, shadow_of=shadow_of, command=self.command, env=dict(self.env),
                                cwd=self.cwd, restart=self.restart, stop_timeout_s=self.stop_timeout_s)

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
        out["restart"] = {"max_retries": self.restart.max_retries, "backoff_s": self.restart.backoff_s}
        out["stop_timeout_s"] = self.stop_timeout_s
        if self.sharing:
            out["sharing"] = [s.to_dict() for s in self.sharing]
        return out


@dataclass(frozen=True)
class ScalingGroupSpec:
    name: str
    components: tuple[str, ...]
    replicas: int
    sharing: tuple[SharingSpec, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "components": list(self.components), "replicas": self.replicas,
                "sharing": [s.to_dict() for s in self.sharing]}


@dataclass(frozen=True)
class ReplicaSizes:
    """The counts inside one set replica: replicas of each scaling group, and
    of each (non-shadow) component instance, in or out of scaling groups."""

    scaling_groups: Mapping[str, int]
    components: Mapping[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"scaling_groups": dict(self.scaling_groups), "components": dict(self.components)}


@dataclass(frozen=True)
class DeploymentSpec:
    name: str
    replicas: int
    claims: tuple[ClaimSpec, ...]
    components: tuple[ComponentSpec, ...]
    scaling_groups: tuple[ScalingGroupSpec, ...]
    sharing: tuple[SharingSpec, ...]
    sizes: tuple[ReplicaSizes, ...]

    def claim(self, name: str) -> Claim:
        return next(c.claim for c in self.claims if c.name == name)

    def component(self, name: str) -> ComponentSpec:
        return next(c for c in self.components if c.name == name)

    def group_of(self, component: str) -> str | None:
        """The scaling group a component belongs to; None for a standalone one."""
        return next((g.name for g in self.scaling_groups if component in g.components), None)

    def file_sizes(self) -> ReplicaSizes:
        """The counts a fresh set replica starts with: the file's."""
        return ReplicaSizes(
            scaling_groups={g.name: g.replicas for g in self.scaling_groups},
            components={c.name: c.replicas for c in self.components if c.shadow_of is None},
        )

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
        return {
            "name": self.name, "replicas": self.replicas,
            "claims": [c.to_dict() for c in self.claims],
            "components": [c.to_dict() for c in self.components],
            "scaling_groups": [g.to_dict() for g in self.scaling_groups],
            "sharing": [s.to_dict() for s in self.sharing],
        }

    def to_dict(self) -> dict[str, Any]:
        """What `DeploymentRecord.spec` keeps: the file and the counts as scaled."""
        return {"file": self.file_dict(), "sizes": [s.to_dict() for s in self.sizes]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeploymentSpec:
        spec = parse(data["file"])
        sizes = tuple(ReplicaSizes(scaling_groups=dict(s["scaling_groups"]), components=dict(s["components"]))
                      for s in data["sizes"])
        return replace(spec, sizes=sizes)


def parse(data: Any, source: str | None = None) -> DeploymentSpec:
    """Validate a deployment file; refusals name the file, the path and the problem."""
    try:
        return _Parser().parse(data)
    except DeploymentError as exc:
        raise exc.within(source) from None


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
            raise DeploymentError("", f"field is immutable: {changed} "
                                      "(delete the deployment and apply the file again to change it)", source)


def _first_difference(path: str, old: Any, new: Any) -> str | None:
    """The deepest path where two JSON values first differ."""
    if old == new:
        return None
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return next(p for i, (a, b) in enumerate(zip(old, new)) if (p := _first_difference(f"{path}[{i}]", a, b)))
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            if key not in old or key not in new:
                return f"{path}.{key}"
            found = _first_difference(f"{path}.{key}", old[key], new[key])
            if found:
                return found
    return path


class _Parser:
    """One pass over the file; every check names the path it looked at."""

    def parse(self, data: Any) -> DeploymentSpec:
        top = _table(data, "", _TOP_KEYS)
        name = _name(top.get("name"), "name")
        claims = tuple(self.claim(c, f"claims[{i}]") for i, c in enumerate(_array(top, "claims", "")))
        _unique([c.name for c in claims], "claims", "claim", ".name")
        self.claim_names = {c.name for c in claims}
        raw_components = _array(top, "components", "")
        if not raw_components:
            raise DeploymentError("components", "a deployment needs at least one component")
        names = [_name(_table(c, f"components[{i}]", _COMPONENT_KEYS).get("name"), f"components[{i}].name")
                 for i, c in enumerate(raw_components)]
        _unique(names, "components", "component", ".name")
        self.component_names = set(names)
        raw_groups = _array(top, "scaling_groups", "")
        groups = tuple(self.scaling_group(g, f"scaling_groups[{i}]") for i, g in enumerate(raw_groups))
        _unique([g.name for g in groups], "scaling_groups", "scaling group", ".name")
        self.group_names = {g.name for g in groups}
        self.group_of: dict[str, str] = {}
        for i, g in enumerate(groups):
            if g.name in self.component_names:
                raise DeploymentError(f"scaling_groups[{i}].name",
                                      f"{g.name!r} is also a component: a scaling group needs a name of its own")
            for j, member in enumerate(g.components):
                if member in self.group_of:
                    raise DeploymentError(f"scaling_groups[{i}].components[{j}]",
                                          f"{member!r} is already in scaling group {self.group_of[member]!r}")
                self.group_of[member] = g.name
        components = tuple(self.component(c, f"components[{i}]", raw_components) for i, c in enumerate(raw_components))
        self.shadows = {c.name: c.shadow_of for c in components if c.shadow_of}
        for i, g in enumerate(groups):
            for j, entry in enumerate(g.sharing):
                self.check_filter(entry, f"scaling_groups[{i}].sharing[{j}]", g)
        sharing = self.sharing_list(top.get("sharing", []), "sharing", "set")
        for j, entry in enumerate(sharing):
            self.check_filter(entry, f"sharing[{j}]", None)
        replicas = _count(top, "replicas", "")
        spec = DeploymentSpec(name=name, replicas=replicas, claims=claims, components=components,
                              scaling_groups=groups, sharing=sharing, sizes=())
        return replace(spec, sizes=(spec.file_sizes(),) * replicas)

    def claim(self, data: Any, path: str) -> ClaimSpec:
        table = _table(data, path, _CLAIM_FIELDS)
        name = _name(table.get("name"), f"{path}.name")
        fields = {_CLAIM_KEYS.get(k, k): v for k, v in table.items() if k != "name"}
        try:
            claim = Claim.from_dict(fields, path)
        except ClaimError as exc:
            head, dot, rest = exc.path[len(path):].lstrip(".").partition(".")
            where = _FILE_KEYS.get(head, head) + dot + rest
            raise DeploymentError(f"{path}.{where}" if where else path, exc.problem) from None
        return ClaimSpec(name, claim)

    def scaling_group(self, data: Any, path: str) -> ScalingGroupSpec:
        table = _table(data, path, _GROUP_KEYS)
        name = _name(table.get("name"), f"{path}.name")
        members = _array(table, "components", path)
        if not members:
            raise DeploymentError(f"{path}.components", "a scaling group needs at least one component")
        for j, member in enumerate(members):
            where = f"{path}.components[{j}]"
            if _name(member, where) not in self.component_names:
                raise DeploymentError(where, f"no component named {member!r} in this file")
        _unique(members, f"{path}.components", "component")
        return ScalingGroupSpec(name=name, components=tuple(members), replicas=_count(table, "replicas", path),
                                sharing=self.sharing_list(table.get("sharing", []), f"{path}.sharing", "group"))

    def component(self, data: dict[str, Any], path: str, raw: list[Any]) -> ComponentSpec:
        name = data["name"]
        shadow_of = data.get("shadow_of")
        if shadow_of is not None:
            shadow_of = _name(shadow_of, f"{path}.shadow_of")
            self.check_shadow(name, shadow_of, path, raw)
        body = {k: data[k] for k in ("name", "command", "env", "cwd", "restart", "stop_timeout_s") if k in data}
        try:
            request = parse_component(body)
        except RequestError as exc:
            raise DeploymentError(f"{path}.{exc.path}", exc.problem) from None
        if request.cwd is not None and not os.path.isabs(request.cwd):
            raise DeploymentError(f"{path}.cwd", f"{request.cwd!r} is not an absolute path")
        return ComponentSpec(
            name=name, command=request.command, env=dict(request.env), cwd=request.cwd,
            replicas=_count(data, "replicas", path), restart=request.restart,
            stop_timeout_s=request.stop_timeout_s,
            sharing=self.sharing_list(data.get("sharing", []), f"{path}.sharing", "component"),
            shadow_of=shadow_of,
        )

    def check_shadow(self, name: str, primary: str, path: str, raw: list[Any]) -> None:
        where = f"{path}.shadow_of"
        if primary == name:
            raise DeploymentError(where, "a component cannot be its own shadow")
        if primary not in self.component_names:
            raise DeploymentError(where, f"no component named {primary!r} in this file")
        if self.group_of.get(primary) != self.group_of.get(name):
            raise DeploymentError(where, f"{name!r} and {primary!r} must be in the same scaling group "
                                         "(or both outside any): a shadow lives beside its primary")
        target = next(c for c in raw if c.get("name") == primary)
        if target.get("shadow_of") is not None:
            raise DeploymentError(where, f"{primary!r} is itself a shadow: name its primary "
                                         f"{target['shadow_of']!r}")
        for key, why in (("replicas", "a shadow has one replica per replica of its primary"),
                         ("sharing", "a shadow uses its primary's groups")):
            if key in next(c for c in raw if c.get("name") == name):
                raise DeploymentError(f"{path}.{key}", f"not allowed with shadow_of: {why}")

    def sharing_list(self, data: Any, path: str, level: str) -> tuple[SharingSpec, ...]:
        if not isinstance(data, list):
            raise DeploymentError(path, "expected an array of tables")
        entries = tuple(self.sharing(entry, f"{path}[{j}]", level) for j, entry in enumerate(data))
        seen: set[str] = set()
        for j, entry in enumerate(entries):
            if entry.claim in seen:
                raise DeploymentError(f"{path}[{j}].claim", f"duplicate claim {entry.claim!r} in this list")
            seen.add(entry.claim)
        return entries

    def sharing(self, data: Any, path: str, level: str) -> SharingSpec:
        table = _table(data, path, ("claim", "scope", "filter"))
        if level == "component" and "filter" in table:
            raise DeploymentError(f"{path}.filter", "component-level sharing has no filter: "
                                                    "it applies to the component's own replicas")
        claim = _name(table.get("claim"), f"{path}.claim")
        if claim not in self.claim_names:
            raise DeploymentError(f"{path}.claim", f"no claim named {claim!r} in [[claims]]")
        scope = table.get("scope")
        if scope not in SCOPES:
            raise DeploymentError(f"{path}.scope", f"unknown scope {scope!r}: use all-replicas or per-replica")
        if "filter" not in table:
            return SharingSpec(claim, scope)
        keys = ("components", "scaling_groups") if level == "set" else ("components",)
        flt = _table(table["filter"], f"{path}.filter", keys)
        lists = {key: tuple(_array(flt, key, f"{path}.filter")) if key in flt else None for key in keys}
        if not any(lists.values()):
            raise DeploymentError(f"{path}.filter", "a filter must name at least one child "
                                                    "(leave the filter out to target every child)")
        for key, names in lists.items():
            for k, child in enumerate(names or ()):
                _name(child, f"{path}.filter.{key}[{k}]")
            _unique(list(names or ()), f"{path}.filter.{key}", "name")
        return SharingSpec(claim, scope, lists["components"], lists.get("scaling_groups"))

    def check_filter(self, entry: SharingSpec, path: str, group: ScalingGroupSpec | None) -> None:
        """Names in a filter exist where the filter looks, and none is a shadow
        (a shadow always takes exactly its primary's groups)."""
        for k, child in enumerate(entry.components or ()):
            where = f"{path}.filter.components[{k}]"
            if group is not None and child not in group.components:
                raise DeploymentError(where, f"{child!r} is not a component of scaling group {group.name!r}")
            if child not in self.component_names:
                raise DeploymentError(where, f"no component named {child!r} in this file")
            if child in self.shadows:
                raise DeploymentError(where, f"{child!r} is a shadow of {self.shadows[child]!r}: "
                                             "it uses its primary's groups")
        for k, child in enumerate(entry.scaling_groups or ()):
            if child not in self.group_names:
                raise DeploymentError(f"{path}.filter.scaling_groups[{k}]", f"no scaling group named {child!r}")


def _table(data: Any, path: str, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise DeploymentError(path, "expected a table")
    unknown = sorted(str(k) for k in data if k not in keys)
    if unknown:
        where = f"{path}.{unknown[0]}" if path else unknown[0]
        raise DeploymentError(where, f"unknown field (known: {', '.join(keys)})")
    return dict(data)


def _array(table: Mapping[str, Any], key: str, path: str) -> list[Any]:
    value = table.get(key, [])
    if not isinstance(value, list):
        raise DeploymentError(f"{path}.{key}" if path else key, "expected an array")
    return value


def _name(value: Any, path: str) -> str:
    if value is None:
        raise DeploymentError(path, "required")
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise DeploymentError(path, f"{str(value)[:80]!r} is not a valid name: use 1-63 lowercase letters, "
                                    "digits and '-', starting with a letter or digit")
    return value


def _count(table: Mapping[str, Any], key: str, path: str) -> int:
    value = table.get(key, 1)
    where = f"{path}.{key}" if path else key
    if isinstance(value, bool) or not isinstance(value, int):
        raise DeploymentError(where, f"expected an integer, got {value!r}")
    if not 0 <= value <= MAX_REPLICAS:
        raise DeploymentError(where, f"must be between 0 and {MAX_REPLICAS}, got {value}")
    return value


def _unique(names: list[str], path: str, what: str, suffix: str = "") -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise DeploymentError(f"{path}[{i}]{suffix}", f"duplicate {what} {name!r}")
        seen.add(name)
