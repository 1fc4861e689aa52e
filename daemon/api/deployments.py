"""The /v1/deployments routes, added to cgd's server through `CgdApp(extra_routes=...)`.

Transport only, like the rest of the server: bodies are checked for shape
here, the file itself is validated again by `computegroups.daemon.model.deployment` (a
client's own check is never trusted), and every decision is `Deployments`'.
"""

from __future__ import annotations

from typing import Any

from computegroups.daemon.deployments.ops import Deployments
from computegroups.daemon.model.requests import MAX_REPLICAS, RequestError, check_name
from computegroups.daemon.api.server import ApiHandler

MAX_SOURCE = 4096


class _DeploymentHandler(ApiHandler):
    """Bound to one `Deployments` by `deployment_routes`."""

    deployments: Deployments


class DeploymentsHandler(_DeploymentHandler):
    async def get(self) -> None:
        await self.run(lambda: {"deployments": self.deployments.summaries()})

    async def post(self) -> None:
        await self.run(lambda: self.deployments.apply(self.caller, *parse_apply(self.body())))


class DeploymentHandler(_DeploymentHandler):
    async def get(self, name: str) -> None:
        await self.run(lambda: self.deployments.tree(check_name(name)))

    async def delete(self, name: str) -> None:
        await self.run(lambda: self.deployments.delete(self.caller, check_name(name)))


class DeploymentScaleHandler(_DeploymentHandler):
    async def post(self, name: str) -> None:
        await self.run(lambda: self.deployments.scale(self.caller, check_name(name), *parse_scale(self.body())))


def parse_apply(body: Any) -> tuple[dict[str, Any], str | None]:
    """`{"spec": <the file as JSON>, "source": "<file path>"}`."""
    data = _object(body, {"spec", "source"})
    if "spec" not in data:
        raise RequestError("spec: required (the deployment file as a JSON object)")
    if not isinstance(data["spec"], dict):
        raise RequestError("spec: expected a JSON object")
    source = data.get("source")
    if source is not None and (not isinstance(source, str) or not source or len(source) > MAX_SOURCE
                               or "\0" in source):
        raise RequestError(f"source: expected a file path of 1 to {MAX_SOURCE} characters")
    return data["spec"], source


def parse_scale(body: Any) -> tuple[str | None, int]:
    """`{"target": null | "<scaling group or component>", "replicas": N}`."""
    data = _object(body, {"target", "replicas"})
    target = data.get("target")
    if target is not None:
        check_name(target, "target")
    replicas = data.get("replicas")
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise RequestError("replicas: required, an integer")
    if not 0 <= replicas <= MAX_REPLICAS:
        raise RequestError(f"replicas: must be between 0 and {MAX_REPLICAS}, got {replicas}")
    return target, replicas


def _object(body: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError("body: expected a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise RequestError(f"{unknown[0]}: unknown field (known: {', '.join(sorted(allowed))})")
    return body


def deployment_routes(deployments: Deployments) -> list[tuple[str, type[ApiHandler]]]:
    """The routes for `CgdApp(extra_routes=...)`, each handler bound to `deployments`."""
    name = r"([^/]+)"
    bound = {h: type(h.__name__, (h,), {"deployments": deployments})
             for h in (DeploymentsHandler, DeploymentHandler, DeploymentScaleHandler)}
    return [
        (r"/v1/deployments", bound[DeploymentsHandler]),
        (rf"/v1/deployments/{name}", bound[DeploymentHandler]),
        (rf"/v1/deployments/{name}/scale", bound[DeploymentScaleHandler]),
    ]
