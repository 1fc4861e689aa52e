"""computegroups on a Kubernetes cluster: deployments as Grove PodCliqueSets, claims as DRA.

`render` turns the typed deployment model into plain manifests (dicts), with
no cluster and no Kubernetes library: `cgctl render kubernetes` prints them,
and the provider applies them. The local path never imports this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from computegroups.daemon.kubernetes.cluster_errors import KubernetesExtraMissing

if TYPE_CHECKING:
    from computegroups.daemon.kubernetes.provider import KubernetesComputeResourceProvider

EXTRA = ("lightkube", "httpx2")
"""The top-level modules the `kubernetes` extra brings (httpx2: lightkube's HTTP client)."""


def provider_class(who: str = "the Kubernetes provider") -> type[KubernetesComputeResourceProvider]:
    """The provider class, or `KubernetesExtraMissing` (saying `who` needs it, and how to install it)
    where the extra is not installed: the one place that tells a missing extra from a broken import."""
    try:
        from computegroups.daemon.kubernetes.provider import KubernetesComputeResourceProvider
    except ImportError as exc:
        if (exc.name or "").split(".")[0] not in EXTRA:
            raise
        raise KubernetesExtraMissing(who) from None
    return KubernetesComputeResourceProvider
