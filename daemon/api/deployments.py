"""The /v1/deployments routes, added to cgd's server through `CgdApp(extra_routes=...)`.

Transport only, like the rest of the server: bodies are decoded into the
model here, the file itself is decoded by `computegroups.daemon.model.deployment`
(a client's own check is never trusted), and every decision is `Deployments'`.
"""

from __future__ import annotations

from typing import Any

from computegroups.daemon.api.handlers import ApiHandler
from computegroups.daemon.deployments.ops import Deployments
from computegroups.daemon.model.deployment import ApplyRequest, DeploymentScaleRequest
from computegroups.daemon.model.requests import check_name


class _DeploymentHandler(ApiHandler):
    """Bound to one `Deployments` by `deployment_routes`."""

    deployments: Deployments


class DeploymentsHandler(_DeploymentHandler):
    async def get(self) -> None:
        await self.run(lambda: {"deployments": self.deployments.summaries()})

    async def post(self) -> None:
        def apply() -> Any:
            body = self.decode(ApplyRequest)
            return self.deployments.apply(self.caller, body.spec, body.source, body.included)
        await self.run(apply)


class DeploymentHandler(_DeploymentHandler):
    async def get(self, name: str) -> None:
        await self.run(lambda: self.deployments.tree(check_name(name)))

    async def delete(self, name: str) -> None:
        await self.run(lambda: self.deployments.delete(self.caller, check_name(name)))


class DeploymentScaleHandler(_DeploymentHandler):
    async def post(self, name: str) -> None:
        def scale() -> Any:
            body = self.decode(DeploymentScaleRequest)
            return self.deployments.scale(self.caller, check_name(name), body.target, body.replicas)
        await self.run(scale)


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
