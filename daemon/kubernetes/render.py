"""A deployment file as a Grove PodCliqueSet, in plain dicts (no cluster, no Kubernetes library).

`render_deployment` is the one entry: `cgctl render kubernetes` prints what
it returns, and the Kubernetes provider applies the same documents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from computegroups.daemon.model.deployment import DeploymentSpec

GROVE_API = "grove.io/v1alpha1"
MANAGED_BY = {"app.kubernetes.io/managed-by": "computegroups"}


@dataclass(frozen=True)
class Rendered:
    """The manifests (the PodCliqueSet first) and what has no Kubernetes form, each naming its field."""

    documents: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)


def render_deployment(spec: DeploymentSpec, *, namespace: str, image: str | None,
                      sharing: str = "dra") -> Rendered:
    """The PodCliqueSet of `spec` in `namespace`; `sharing` is `dra` or `mps` (how a share is claimed)."""
    cliques = [{"name": c.name, "spec": {"roleName": c.name, "replicas": c.replicas, "podSpec": {
        "containers": [{"name": c.name, "image": image, **({"command": list(c.command)} if c.command else {})}]}}}
        for c in spec.components]
    pcs = {"apiVersion": GROVE_API, "kind": "PodCliqueSet",
           "metadata": {"name": spec.name, "namespace": namespace, "labels": dict(MANAGED_BY)},
           "spec": {"replicas": spec.replicas, "template": {"cliques": cliques}}}
    return Rendered(documents=[pcs])
