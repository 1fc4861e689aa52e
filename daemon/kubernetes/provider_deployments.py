"""Deployments on a cluster: a deployment file rendered as a Grove PodCliqueSet, applied server-side.

The manifests are `render.render_deployment`'s, the same `cgctl render
kubernetes` prints, so what is applied is what a person can read first.
Server-side apply (field manager `computegroups`) makes `apply` both the
create and the update, and leaves fields other managers own (an autoscaler's
replicas) to them: a conflict is refused, not overwritten. Grove turns the
PodCliqueSet into pods and DRA claims; nothing of it is kept here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimTemplate

from computegroups.daemon.kubernetes import cluster_objects as k
from computegroups.daemon.kubernetes.cluster_errors import ClusterError
from computegroups.daemon.kubernetes.provider import FIELD_MANAGER, KubernetesComputeResourceProvider
from computegroups.daemon.kubernetes.render import RenderError, render_deployment
from computegroups.daemon.model.deployment import parse

Json = Any
PodCliqueSet = create_namespaced_resource("grove.io", "v1alpha1", "PodCliqueSet", "podcliquesets")
KINDS: dict[tuple[str, str], Any] = {
    ("grove.io/v1alpha1", "PodCliqueSet"): PodCliqueSet,
    ("resource.k8s.io/v1", "ResourceClaimTemplate"): ResourceClaimTemplate,
    ("resource.k8s.io/v1", "ResourceClaim"): ResourceClaim,
}
"""What a rendered deployment may hold: Grove's set (a CRD, so a generic resource) and DRA's claims."""


def summary(pcs: Mapping[str, Json]) -> dict[str, Json]:
    """What `get` and `list` answer of one PodCliqueSet: its levels and counts, and Grove's status."""
    meta = pcs.get("metadata") or {}
    template = (pcs.get("spec") or {}).get("template") or {}
    return {
        "name": meta.get("name"), "namespace": meta.get("namespace"),
        "replicas": (pcs.get("spec") or {}).get("replicas"),
        "cliques": [{"name": c.get("name"), "replicas": (c.get("spec") or {}).get("replicas")}
                    for c in template.get("cliques") or []],
        "scaling_groups": [{"name": g.get("name"), "replicas": g.get("replicas"), "cliques": g.get("cliqueNames")}
                           for g in template.get("podCliqueScalingGroups") or []],
        "claims": [t.get("name") for t in template.get("resourceClaimTemplates") or []],
        "status": pcs.get("status") or {},
    }


class KubernetesDeployments:
    """apply / get / list / delete of deployments in the provider's namespace."""

    def __init__(self, provider: KubernetesComputeResourceProvider) -> None:
        self.provider = provider

    @property
    def namespace(self) -> str:
        return self.provider.namespace

    async def apply(self, data: Mapping[str, Json], *, image: str | None, source: str | None = None,
                    sharing: str = "dra", included: Mapping[str, Json] | None = None) -> dict[str, Json]:
        """Create the file's deployment or bring it to this version; answers its summary,
        `created`, the documents applied and the render's warnings. `included`: the content of
        the files its `include` names, as `deployfile.load_deployment` reads them."""
        spec = parse(dict(data), source=source, included=dict(included or {}))
        try:
            rendered = render_deployment(spec, namespace=self.namespace, image=image, sharing=sharing)
        except RenderError as exc:  # named as a bad file is: `FILE: <field>: <problem>`
            raise RenderError(f"{source}: {exc}" if source else str(exc)) from None
        created = not await self._exists(spec.name)
        applied = []
        for doc in rendered.documents:
            res = KINDS.get((doc.get("apiVersion", ""), doc.get("kind", "")))
            if res is None:
                raise ValueError(f"{doc.get('kind')}: the render made a kind the provider does not apply")
            meta = doc.setdefault("metadata", {})
            meta["namespace"] = self.namespace
            meta["labels"] = {**(meta.get("labels") or {}), **k.managed_labels(**{k.DEPLOYMENT: spec.name})}
            async with self.provider.translated():
                await self.provider.client.apply(res.from_dict(doc), field_manager=FIELD_MANAGER)
            applied.append(f"{doc['kind']}/{meta['name']}")
        return {**await self.get(spec.name), "created": created, "applied": applied,
                "warnings": list(rendered.warnings)}

    async def _exists(self, name: str) -> bool:
        try:
            await self._read(name)
        except ClusterError as exc:
            if exc.code == "not_found":
                return False
            raise
        return True

    async def _read(self, name: str) -> dict[str, Json]:
        async with self.provider.translated():
            pcs: dict[str, Json] = (await self.provider.client.get(
                PodCliqueSet, name, namespace=self.namespace)).to_dict()
        if ((pcs.get("metadata") or {}).get("labels") or {}).get(k.MANAGED_BY) != k.MANAGER:
            raise ClusterError(404, "not_found", f"PodCliqueSet {name} was not applied by computegroups")
        return pcs

    async def get(self, name: str) -> dict[str, Json]:
        try:
            return summary(await self._read(name))
        except ClusterError as exc:
            if exc.code == "not_found":
                raise ClusterError(404, "not_found", f"no deployment {name} in namespace {self.namespace}") from None
            raise

    async def list(self) -> list[dict[str, Json]]:
        async with self.provider.translated():
            found = [o.to_dict() async for o in self.provider.client.list(
                PodCliqueSet, namespace=self.namespace, labels=dict(k.selector()))]
        return sorted((summary(p) for p in found), key=lambda d: str(d["name"]))

    async def delete(self, name: str) -> dict[str, Json]:
        """Delete the deployment's PodCliqueSet (Grove takes its pods and claims with it)."""
        await self.get(name)
        async with self.provider.translated():
            await self.provider.client.delete(PodCliqueSet, name, namespace=self.namespace)
        return {"deleted": name, "namespace": self.namespace}
