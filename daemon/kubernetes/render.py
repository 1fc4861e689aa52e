"""A deployment file as a Grove PodCliqueSet, in plain dicts (no cluster, no Kubernetes library).

`render_deployment` is the one entry: `cgctl render kubernetes` prints what
it returns, and the Kubernetes provider applies the same documents. The
form is the PodCliqueSet of ai-dynamo/grove v0.1.0-alpha.11 (`grove.io/v1alpha1`,
with hierarchical resource sharing, GREP-390), whose levels are the file's:

- each component is a clique (`cliques[]`), each scaling group a
  `podCliqueScalingGroups[]` entry, the file's claims the set's
  `resourceClaimTemplates` (render_claims.py says how a claim reads in DRA);
- each sharing entry is a `resourceSharing` entry at the same level, with
  the same scope and filter (`childCliqueNames`, `childScalingGroupNames`);
- a shadow is a clique of its own, beside its primary and on its claims.

The mapping field by field, and what has no Kubernetes form, is in
docs/kubernetes.md; the latter comes back as `Rendered.warnings`, each
naming the file's field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from computegroups.daemon.kubernetes.render_claims import (
    SHARINGS,
    claim_template_spec,
    claim_warnings,
    pod_affinity,
)
from computegroups.daemon.kubernetes.render_pods import COMPONENT_LABEL, pod_spec, process_warnings
from computegroups.daemon.model.deployment import DeploymentSpec, SharingSpec
from computegroups.daemon.model.enums import Scope

GROVE_API = "grove.io/v1alpha1"
MANAGED_BY = {"app.kubernetes.io/managed-by": "computegroups"}
SHADOW_ANNOTATION = "computegroups.io/shadow-of"
NOTE_ANNOTATION = "computegroups.io/note"
SCOPES = {Scope.ALL_REPLICAS: "AllReplicas", Scope.PER_REPLICA: "PerReplica"}
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

Entry = dict[str, Any]


class RenderError(ValueError):
    """The deployment cannot be rendered as asked; the message is one line that says what to give."""


@dataclass(frozen=True)
class Rendered:
    """The manifests (the PodCliqueSet first) and what has no Kubernetes form, each naming its field."""

    documents: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)


def render_deployment(spec: DeploymentSpec, *, namespace: str, image: str | None,
                      sharing: str = "dra") -> Rendered:
    """The PodCliqueSet of `spec` in `namespace`.

    `image` runs every component that names no `image` of its own;
    `sharing` is how a share is claimed: `dra` (consumable capacity) or
    `mps` (NVIDIA's MPS configuration), see render_claims.py.
    """
    if sharing not in SHARINGS:
        raise RenderError(f"sharing: must be one of {', '.join(SHARINGS)}, got {sharing!r}")
    if not _DNS_LABEL.fullmatch(namespace):
        raise RenderError(f"namespace: {namespace!r} is not a valid namespace name (a DNS label)")
    for i, c in enumerate(spec.components):
        if not (c.image or image):
            raise RenderError(f"components[{i}].image: {c.name!r} names no image and none was given: every "
                              "component runs in a container on Kubernetes (give it an `image`, or "
                              "--image IMAGE for every component without one)")
    plan = _SharingPlan(spec)
    cpus = {c.name: sum(spec.claim(n).cpus or 0 for n in plan.claims_of(c.name)) for c in spec.components}
    plan.drop({c.name for c in spec.claims if c.claim.kind == "cpu"})
    templates, warnings = _claim_templates(spec, sharing)
    warnings = plan.warnings + warnings
    if any(s != spec.file_sizes() for s in spec.sizes):
        warnings.append("replicas: counts changed by `cgctl scale` are not rendered: the PodCliqueSet "
                        "starts from the file's counts (scale it on the cluster)")
    cliques = []
    for i in range(len(spec.components)):
        clique, notes = _clique(spec, i, plan, image, cpus[spec.components[i].name])
        cliques.append(clique)
        warnings += notes
    template: dict[str, Any] = {"cliques": cliques}
    if spec.scaling_groups:
        template["podCliqueScalingGroups"] = [
            {"name": g.name, "replicas": g.replicas, "cliqueNames": list(g.components),
             **({"resourceSharing": plan.groups[g.name]} if plan.groups[g.name] else {})}
            for g in spec.scaling_groups]
    if templates:
        template["resourceClaimTemplates"] = templates
    if plan.set:
        template["resourceSharing"] = plan.set
    pcs = {"apiVersion": GROVE_API, "kind": "PodCliqueSet",
           "metadata": {"name": spec.name, "namespace": namespace, "labels": dict(MANAGED_BY)},
           "spec": {"replicas": spec.replicas, "template": template}}
    return Rendered(documents=[pcs], warnings=warnings)


def _claim_templates(spec: DeploymentSpec, sharing: str) -> tuple[list[Entry], list[str]]:
    """The set's `resourceClaimTemplates`, and what the claims say that they do not carry."""
    per_replica = {e.claim for _, e in _all_entries(spec) if e.scope is Scope.PER_REPLICA}
    all_replicas = {e.claim for _, e in _all_entries(spec) if e.scope is Scope.ALL_REPLICAS}
    templates, warnings = [], []
    for i, claim in enumerate(spec.claims):
        if claim.claim.kind != "cpu":
            templates.append({"name": claim.name,
                              "templateSpec": {"spec": claim_template_spec(claim.claim, sharing)}})
        warnings += claim_warnings(claim, _claim_path(spec, i), claim.name in per_replica,
                                   claim.name in all_replicas)
    shares = [_claim_path(spec, i) for i, c in enumerate(spec.claims) if c.claim.kind == "share"]
    if shares and sharing == "dra":
        more = f" (and {len(shares) - 1} more)" if len(shares) > 1 else ""
        warnings.append(f"{shares[0]}{more}: a share is rendered as consumable capacity (KEP-5075), which "
                        "needs a DRA driver that publishes shareable GPUs; NVIDIA's does not today "
                        "(--sharing mps renders MPS instead)")
    return templates, warnings


def _claim_path(spec: DeploymentSpec, i: int) -> str:
    """Claim `i` as its own file says it: an included file's claims are named by that file and their index there."""
    where, path = spec.locate(f"claims[{i}]", None)
    return f"{where}: {path}" if where else path


def _clique(spec: DeploymentSpec, i: int, plan: _SharingPlan, image: str | None,
            cpus: int) -> tuple[Entry, list[str]]:
    """Component `i` as a clique, and what its process rules say that a pod does not carry.

    `cpus`, what the claims it uses count, is its container's CPU request: a request, not a limit,
    as cgd counts CPUs without pinning or capping them."""
    c = spec.components[i]
    request = c.request(c.name, c.shadow_of)
    if c.time_limit_s is not None:  # a pod's limit only: cgd does not apply it to a deployment's services
        request = msgspec.structs.replace(request, time_limit_s=c.time_limit_s)
    warnings = process_warnings(request, f"components[{i}]")
    affinity = _merge_affinity(pod_affinity(spec.claim(name), COMPONENT_LABEL) for name in plan.claims_of(c.name))
    replicas = spec.component(c.shadow_of).replicas if c.shadow_of else c.replicas
    clique: Entry = {"name": c.name, "labels": {COMPONENT_LABEL: c.name}}
    if c.shadow_of is not None:
        clique["annotations"] = {
            SHADOW_ANNOTATION: c.shadow_of,
            NOTE_ANNOTATION: f"standby of {c.shadow_of} on its claims; promotion is not automatic on Kubernetes"}
        warnings.append(f"components[{i}].shadow_of: {c.name!r} is a clique beside {c.shadow_of!r} on its "
                        "claims; promotion is not automatic on Kubernetes (both run; nothing hands the "
                        f"standby the primary's role when {c.shadow_of!r} fails)")
    if plan.cliques[c.name]:
        clique["resourceSharing"] = plan.cliques[c.name]
    pod = pod_spec(request, c.name, c.image or str(image), affinity, cpus)
    clique["spec"] = {"roleName": c.name, "replicas": replicas, "podSpec": pod}
    return clique, warnings


class _SharingPlan:
    """The `resourceSharing` lists of every level, with each shadow put on its primary's claims.

    A shadow's clique is added wherever a filter names its primary. Its
    primary's own all-replicas entries move one level up, as per-replica
    entries filtered to the pair: one claim per clique then is one claim per
    replica of the level above, now shared by both cliques. A per-replica
    entry of the primary cannot move (Grove pairs no pods of two cliques by
    index): the shadow gets claims of its own from it, with a warning.
    """

    def __init__(self, spec: DeploymentSpec) -> None:
        self.spec = spec
        self.warnings: list[str] = []
        self.shadows: dict[str, list[str]] = {}
        for c in spec.components:
            if c.shadow_of is not None:
                self.shadows.setdefault(c.shadow_of, []).append(c.name)
        self.set = [self._set_entry(j, e) for j, e in enumerate(spec.sharing)]
        self.groups = {g.name: [self._entry(e, e.components) for e in g.sharing] for g in spec.scaling_groups}
        self.cliques: dict[str, list[Entry]] = {c.name: [] for c in spec.components}
        for i, c in enumerate(spec.components):
            for j, e in enumerate(c.sharing):
                self._component_entry(f"components[{i}].sharing[{j}]", c.name, e)

    def drop(self, claims: set[str]) -> None:
        """Share none of `claims` at any level (CPU-only claims: they have no DRA form)."""
        self.set = [e for e in self.set if e["name"] not in claims]
        for entries in (*self.groups.values(), *self.cliques.values()):
            entries[:] = [e for e in entries if e["name"] not in claims]

    def with_shadows(self, names: Iterable[str]) -> list[str]:
        return [n for name in names for n in (name, *self.shadows.get(name, ()))]

    def claims_of(self, clique: str) -> list[str]:
        """The claims whose devices the clique's pods get, from every level."""
        group = self.spec.group_of(clique)
        found = [e for e in self.set if self._reaches(e, clique, group, top=True)]
        if group is not None:
            found += [e for e in self.groups[group] if self._reaches(e, clique, group, top=False)]
        found += self.cliques[clique]
        return list(dict.fromkeys(e["name"] for e in found))

    @staticmethod
    def _reaches(entry: Entry, clique: str, group: str | None, top: bool) -> bool:
        flt = entry.get("filter")
        if flt is None:
            return True
        if clique in flt.get("childCliqueNames", ()):
            return True
        return top and group is not None and group in flt.get("childScalingGroupNames", ())

    def _entry(self, e: SharingSpec, cliques: Iterable[str] | None, groups: list[str] | None = None) -> Entry:
        entry: Entry = {"name": e.claim, "scope": SCOPES[e.scope]}
        flt = {}
        if cliques:
            flt["childCliqueNames"] = self.with_shadows(cliques)
        if groups:
            flt["childScalingGroupNames"] = groups
        if flt:
            entry["filter"] = flt
        return entry

    def _set_entry(self, j: int, e: SharingSpec) -> Entry:
        """Grove's set-level filter names only the set's immediate children: a component inside a
        scaling group is reached through its group, with a warning that its group mates are too."""
        standalone = [c for c in e.components or () if self.spec.group_of(c) is None]
        groups = list(e.scaling_groups or ())
        for k, c in enumerate(e.components or ()):
            group = self.spec.group_of(c)
            if group is None:
                continue
            if group not in groups:
                groups.append(group)
            self.warnings.append(
                f"sharing[{j}].filter.components[{k}]: {c!r} is in scaling group {group!r} and Grove's set-level "
                f"filter names only the set's own cliques and scaling groups: every clique of {group!r} gets "
                f"claim {e.claim!r}")
        return self._entry(e, standalone, groups)

    def _component_entry(self, path: str, clique: str, e: SharingSpec) -> None:
        shadows = self.shadows.get(clique, [])
        group = self.spec.group_of(clique)
        above = self.set if group is None else self.groups[group]
        if shadows and e.scope is Scope.ALL_REPLICAS and all(x["name"] != e.claim for x in above):
            above.append({"name": e.claim, "scope": SCOPES[Scope.PER_REPLICA],
                          "filter": {"childCliqueNames": [clique, *shadows]}})
            return
        entry = self._entry(e, None)
        for name in (clique, *shadows):
            self.cliques[name].append(dict(entry))
        if shadows:
            where = "per-replica" if e.scope is Scope.PER_REPLICA else "also shared one level up"
            self.warnings.append(
                f"{path}: claim {e.claim!r} ({where}) cannot be shared with the shadow "
                f"{', '.join(map(repr, shadows))} in Grove (it pairs no pods of two cliques by index): "
                "the shadow gets claims of its own from it")


def _all_entries(spec: DeploymentSpec) -> list[tuple[str, SharingSpec]]:
    out: list[tuple[str, SharingSpec]] = [("set", e) for e in spec.sharing]
    out += [(g.name, e) for g in spec.scaling_groups for e in g.sharing]
    out += [(c.name, e) for c in spec.components for e in c.sharing]
    return out


def _merge_affinity(parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One pod affinity from the claims' terms: their required terms all hold."""
    merged: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            terms = merged.setdefault(key, {}).setdefault("requiredDuringSchedulingIgnoredDuringExecution", [])
            terms += [t for t in value["requiredDuringSchedulingIgnoredDuringExecution"] if t not in terms]
    return merged
