"""What can go wrong between the Kubernetes provider and a cluster, as the client's types.

A refusal is a `CgdError` subclass with the code cgd would have answered
(`not_found`, `conflict`, `unsatisfiable`...), so a program written against
`ComputeGroupManager` handles a cluster's refusals with the code it already
has for the local provider's. This module imports no lightkube: the
example and callers may catch these without the `kubernetes` extra.
"""

from __future__ import annotations

from computegroups.daemon.client.errors import CgdError, ClientError

INSTALL_HINT = "pip install 'computegroups[kubernetes]'"


class ClusterError(CgdError):
    """The cluster (or the provider, on its behalf) refused: `code` as in docs/api.md's table."""

    def __repr__(self) -> str:
        return f"ClusterError({self.status}, {self.code!r}, {self.message!r})"


class NotSupportedByCluster(ClusterError):
    """The cluster does not serve an API the operation needs (e.g. DRA device taints for a drain)."""

    def __init__(self, message: str) -> None:
        super().__init__(501, "not_supported", message)


class ClusterUnreachable(ClientError):
    """No kubeconfig, no such context, or the API server did not answer."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class KubernetesExtraMissing(ClientError):
    """lightkube is not installed: the Kubernetes provider is an optional extra
    (`computegroups.daemon.kubernetes.provider_class` raises it; `who` needs it)."""

    def __init__(self, who: str = "the Kubernetes provider") -> None:
        super().__init__(f"{who} needs lightkube: {INSTALL_HINT}")
