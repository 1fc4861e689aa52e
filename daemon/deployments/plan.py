"""What a deployment asks for, as names: component instances and compute groups.

`expand(spec)` is pure: the same spec gives the same plan, so the daemon can
compare the plan it wants with the state it has and change only the
difference (scale-in drops exactly the removed replicas' per-replica groups,
scale-out adds exactly the new ones, all-replicas groups stay). Naming
follows Grove's hierarchical resource sharing:

- set `S`, set replica `i`: a standalone component `C` is the instance
  `S-i-C`; inside replica `j` of scaling group `G` it is `S-i-G-j-C`;
  replica `k` of an instance `P` is the worker `P/k`;
- groups are `<owner>-all-<claim>` (scope all-replicas) and
  `<owner>-<n>-<claim>` (per-replica, `n` the owner's replica index), the
  owner being `S` at the set level, `S-i-G` at the scaling-group level and
  the instance path `P` at the component level.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace

import msgspec

from computegroups.daemon.core.workers import replica_ref
from computegroups.daemon.model.claims import AffinityTerm, Claim
from computegroups.daemon.model.deployment import (
    ComponentTemplate,
    DeploymentError,
    DeploymentSpec,
    SharingSpec,
)
from computegroups.daemon.model.requests import NAME_RE


@dataclass(frozen=True)
class InstancePlan:
    """One component instance: a component record with `deployment` set."""

    path: str
    component: ComponentTemplate
    set_replica: int
    scaling_group: str | None
    group_replica: int | None
    replicas: int
    shadow_of: str | None
    origin: str
    """Where it comes from in the file, for messages: `components[2]`."""

    @property
    def refs(self) -> list[str]:
        return [replica_ref(self.path, k) for k in range(self.replicas)]

    def describe(self) -> str:
        where = f"set replica {self.set_replica}"
        if self.scaling_group is not None:
            where += f", scaling group {self.scaling_group!r} replica {self.group_replica}"
        return f"{self.origin} ({where})"


@dataclass(frozen=True)
class GroupPlan:
    id: str
    claim: str
    owner: str
    scope: str
    replica: int | None
    users: tuple[str, ...]
    origin: str
    """The sharing entry that makes it: `scaling_groups[0].sharing[1]`."""
    set_replica: int | None = None
    """The set replica the group belongs to; None for a set-level all-replicas group."""
    group_path: str | None = None
    """The scaling-group replica (`S-i-G-j`) the group lies inside, if any."""

    def describe(self) -> str:
        return f"{self.origin} (owner {self.owner!r}, claim {self.claim!r})"


@dataclass(frozen=True)
class Plan:
    name: str
    instances: Mapping[str, InstancePlan] = field(default_factory=dict)
    groups: Mapping[str, GroupPlan] = field(default_factory=dict)
    owners: frozenset[str] = frozenset()
    """Every owner path of the deployment: the set, its scaling-group replicas, its instances."""

    def refs(self) -> dict[str, InstancePlan]:
        """Every replica ref the plan wants, with its instance."""
        return {ref: inst for inst in self.instances.values() for ref in inst.refs}

    def groups_of(self) -> dict[str, tuple[str, ...]]:
        """For each replica ref, the ids of the groups it uses."""
        out: dict[str, list[str]] = {ref: [] for ref in self.refs()}
        for gid in sorted(self.groups):
            for ref in self.groups[gid].users:
                out[ref].append(gid)
        return {ref: tuple(ids) for ref, ids in out.items()}


def expand(spec: DeploymentSpec) -> Plan:
    """The instances and groups `spec` asks for, every name checked.

    Raises `DeploymentError` when a generated name is not a valid name or
    when two paths of the file generate the same name.
    """
    builder = _Builder(spec)
    for n, entry in enumerate(spec.sharing):
        if entry.scope == "all-replicas":
            builder.group(f"{spec.name}-all-{entry.claim}", entry, spec.name, None, [], f"sharing[{n}]")
    for i, sizes in enumerate(spec.sizes):
        builder.set_replica(i, sizes.scaling_groups, sizes.components)
    builder.add_shadows()
    return Plan(
        name=spec.name,
        instances=dict(sorted(builder.instances.items())),
        groups={gid: replace(g.plan, users=tuple(sorted(g.users))) for gid, g in sorted(builder.groups.items())},
        owners=frozenset(builder.owners),
    )


@dataclass
class _Group:
    """A group while the builder still adds users to it."""

    plan: GroupPlan
    users: set[str]


class _Builder:
    def __init__(self, spec: DeploymentSpec) -> None:
        self.spec = spec
        self.instances: dict[str, InstancePlan] = {}
        self.groups: dict[str, _Group] = {}
        self.owners: set[str] = {spec.name}
        self.index = {c.name: i for i, c in enumerate(spec.components)}

    def set_replica(self, i: int, group_sizes: Mapping[str, int], component_sizes: Mapping[str, int]) -> None:
        spec = self.spec
        mine: list[InstancePlan] = []
        for c in spec.components:
            if spec.group_of(c.name) is None:
                mine.append(self.instance(f"{spec.name}-{i}-{c.name}", c, i, None, None, component_sizes))
        for g_index, g in enumerate(spec.scaling_groups):
            owner = self.owner(f"{spec.name}-{i}-{g.name}", f"scaling_groups[{g_index}]")
            members = []
            for j in range(group_sizes[g.name]):
                members.append([self.instance(f"{owner}-{j}-{c}", spec.component(c), i, g.name, j,
                                              component_sizes) for c in g.components])
            for n, entry in enumerate(g.sharing):
                origin = f"scaling_groups[{g_index}].sharing[{n}]"
                per_replica = [[m for m in ms if _targets(entry, m)] for ms in members]
                self.share(entry, owner, origin, per_replica, i, owner)
            mine += [m for ms in members for m in ms]
        for n, entry in enumerate(spec.sharing):
            targets = [m for m in mine if _targets(entry, m)]
            if entry.scope == "all-replicas":
                self.group(f"{spec.name}-all-{entry.claim}", entry, spec.name, None, targets, f"sharing[{n}]")
            else:
                self.group(f"{spec.name}-{i}-{entry.claim}", entry, spec.name, i, targets, f"sharing[{n}]", i)
        for inst in mine:
            inside = None if inst.scaling_group is None else \
                f"{spec.name}-{i}-{inst.scaling_group}-{inst.group_replica}"
            for n, entry in enumerate(inst.component.sharing):
                origin = f"{inst.origin}.sharing[{n}]"
                self.share(entry, inst.path, origin, [[_Replica(inst, k)] for k in range(inst.replicas)], i,
                           inside)

    def instance(self, path: str, c: ComponentTemplate, i: int, group: str | None, j: int | None,
                 sizes: Mapping[str, int]) -> InstancePlan:
        shadow_of = None
        replicas = sizes.get(c.name, 0)
        if c.shadow_of is not None:
            shadow_of = path[: len(path) - len(c.name)] + c.shadow_of
            replicas = sizes[c.shadow_of]
        inst = InstancePlan(path, c, i, group, j, replicas, shadow_of, f"components[{self.index[c.name]}]")
        _check_name(path, inst.origin, inst.describe(), "component instance")
        if path in self.instances:
            raise DeploymentError(inst.origin, f"component instance {path!r} of {inst.describe()} collides with "
                                               f"the one of {self.instances[path].describe()}")
        if path in self.owners:
            raise DeploymentError(inst.origin, f"component instance {path!r} of {inst.describe()} collides with "
                                               "a scaling group replica of the same name")
        self.instances[path] = inst
        self.owners.add(path)
        return inst

    def owner(self, path: str, origin: str) -> str:
        if path in self.instances:
            raise DeploymentError(origin, f"scaling group replica {path!r} collides with the component instance "
                                          f"of {self.instances[path].describe()}")
        self.owners.add(path)
        return path

    def share(self, entry: SharingSpec, owner: str, origin: str, per_replica: list[list], set_replica: int,
              inside: str | None) -> None:
        """One group for every replica of the owner, or one per replica index.

        `inside` is the scaling-group replica the owner lies in, or, for a
        scaling group's own entry, the scaling group (`S-i-G`): then each
        per-replica group lies inside replica n of it.
        """
        group_owner = inside == owner
        if entry.scope == "all-replicas":
            self.group(f"{owner}-all-{entry.claim}", entry, owner, None,
                       [t for targets in per_replica for t in targets], origin, set_replica,
                       None if group_owner else inside)
            return
        for n, targets in enumerate(per_replica):
            self.group(f"{owner}-{n}-{entry.claim}", entry, owner, n, targets, origin, set_replica,
                       f"{owner}-{n}" if group_owner else inside)

    def group(self, gid: str, entry: SharingSpec, owner: str, replica: int | None,
              targets: list, origin: str, set_replica: int | None = None, inside: str | None = None) -> None:
        users = {ref for t in targets for ref in _refs(t)}
        plan = GroupPlan(gid, entry.claim, owner, entry.scope, replica, (), origin, set_replica, inside)
        known = self.groups.get(gid)
        if known is not None and known.plan == plan:
            known.users |= users
            return
        _check_name(gid, origin, plan.describe(), "group")
        if known is not None:
            raise DeploymentError(origin, f"group name {gid!r} of {plan.describe()} collides with "
                                          f"the one of {known.plan.describe()}")
        self.groups[gid] = _Group(plan, users)

    def add_shadows(self) -> None:
        """A shadow replica uses exactly the groups of its primary's replica of the same index."""
        for inst in self.instances.values():
            if inst.shadow_of is None:
                continue
            for k in range(inst.replicas):
                primary = replica_ref(inst.shadow_of, k)
                for group in self.groups.values():
                    if primary in group.users:
                        group.users.add(replica_ref(inst.path, k))


@dataclass(frozen=True)
class _Replica:
    """A component-level target: one replica of one instance."""

    instance: InstancePlan
    index: int


def sibling_claim(spec: DeploymentSpec, group: GroupPlan, claim: Claim) -> Claim:
    """The claim with its affinity terms that name a component of the file resolved to that
    component's instance beside the group, as LeaderWorkerSet places a leader and its workers:
    in the same set replica (and the same scaling-group replica, for a component of one).

    A term naming anything else (a component outside the deployment) stays as written.
    Raises DeploymentError when the group has no such sibling (a set-level all-replicas
    group has no set replica; a scaling group's component is a sibling only inside it).
    """
    names = {c.name for c in spec.components}
    if not any(t.component in names for t in (*claim.affinity, *claim.anti_affinity)):
        return claim

    def resolve(term: AffinityTerm, field: str) -> AffinityTerm:
        if term.component not in names:
            return term
        where = f"claims: {group.claim}.{field}: {term.component!r}"
        if group.set_replica is None:
            raise DeploymentError(group.origin, f"{where} is resolved per set replica, and the all-replicas "
                                                f"group {group.id!r} has none")
        scaling_group = spec.group_of(term.component)
        if scaling_group is None:
            return AffinityTerm(f"{spec.name}-{group.set_replica}-{term.component}", term.level)
        prefix = f"{spec.name}-{group.set_replica}-{scaling_group}-"
        if group.group_path is None or not group.group_path.startswith(prefix):
            raise DeploymentError(group.origin, f"{where} is in scaling group {scaling_group!r}: only a group "
                                                "inside a replica of that scaling group has it as a sibling")
        return AffinityTerm(f"{group.group_path}-{term.component}", term.level)

    return msgspec.structs.replace(
        claim, affinity=tuple(resolve(t, "affinity") for t in claim.affinity),
        anti_affinity=tuple(resolve(t, "anti_affinity") for t in claim.anti_affinity))


def _refs(target: InstancePlan | _Replica) -> Iterator[str]:
    if isinstance(target, _Replica):
        yield replica_ref(target.instance.path, target.index)
    else:
        yield from target.refs


def _targets(entry: SharingSpec, inst: InstancePlan) -> bool:
    """Whether a set or scaling-group entry reaches this instance; shadows
    are reached only through their primary."""
    if inst.shadow_of is not None:
        return False
    if not entry.filtered:
        return True
    return inst.component.name in (entry.components or ()) or inst.scaling_group in (entry.scaling_groups or ())


def _check_name(name: str, origin: str, what: str, kind: str) -> None:
    """Every part is a valid name joined by '-', so only the length can be wrong."""
    if not NAME_RE.fullmatch(name):
        raise DeploymentError(origin, f"the {kind} name {name!r} generated for {what} has {len(name)} "
                                      "characters, more than 63: shorten the deployment, scaling group, "
                                      "component or claim names")
