"""The provider's connection to a cluster: its kubeconfig, and the API server's answers as the client's errors.

Kept apart from the provider so that every call it makes, and
`provider_deployments`' too, turns a refusal into a `ClusterError` with
cgd's codes and a silent server into one `ClusterUnreachable` line that
names the server.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from lightkube import ApiError, ConfigError, KubeConfig

from computegroups.daemon.kubernetes.cluster_errors import ClusterError, ClusterUnreachable

CODES = {400: "bad_request", 403: "forbidden", 404: "not_found", 409: "conflict", 422: "bad_request"}
"""The API server's statuses as docs/api.md's error codes."""


def load_config(kubeconfig: str | os.PathLike[str] | None = None, context: str | None = None) -> Any:
    """The kubeconfig as kubectl finds it (in-cluster, `$KUBECONFIG`, `~/.kube/config`), at `context`."""
    try:
        config = KubeConfig.from_file(kubeconfig) if kubeconfig is not None else KubeConfig.from_env()
        return config.get(context)
    except ConfigError as exc:
        raise ClusterUnreachable(f"no usable kubeconfig: {exc}") from None
    except OSError as exc:
        raise ClusterUnreachable(f"cannot read the kubeconfig: {exc.strerror or exc}") from None


@asynccontextmanager
async def translated(server: str | None = None) -> AsyncIterator[None]:
    """The API server's refusals as `ClusterError`, a silent server as `ClusterUnreachable`
    naming it (`server`: its URL, as the kubeconfig gives it)."""
    try:
        yield
    except ApiError as exc:
        status = exc.status.code or exc.response.status_code
        raise ClusterError(status, CODES.get(status, "cluster_error"), exc.status.message or str(exc)) from None
    except httpx2.HTTPStatusError as exc:  # a Status whose Content-Type has a charset: lightkube leaves it raw
        status = exc.response.status_code
        try:
            message = str(exc.response.json().get("message") or exc.response.reason_phrase)
        except ValueError:
            message = exc.response.reason_phrase
        raise ClusterError(status, CODES.get(status, "cluster_error"), message) from None
    except httpx2.TransportError as exc:
        at = f" at {server}" if server else ""
        raise ClusterUnreachable(f"cannot reach the cluster's API server{at}: {exc or type(exc).__name__}") from None
