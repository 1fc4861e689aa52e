"""Drains on a cluster: DeviceTaintRules, in whichever resource.k8s.io version the cluster serves them.

DeviceTaintRule moved through alpha (1.33) and beta towards v1, behind the
`DRADeviceTaints` feature gate, so the version is found once by API
discovery; a cluster that serves none cannot be drained (a mark the
scheduler does not read would drain nothing). Kept apart from the provider,
which holds one `DeviceTaints` and reads the drains through it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from lightkube.core.generic_client import BasicRequest
from lightkube.generic_resource import create_global_resource

from computegroups.daemon.kubernetes import cluster_objects as k
from computegroups.daemon.kubernetes.cluster_errors import NotSupportedByCluster

if TYPE_CHECKING:
    from computegroups.daemon.kubernetes.provider import KubernetesComputeResourceProvider

Json = Any
FIELD_MANAGER = "computegroups"
TAINT_VERSIONS = ("v1", "v1beta2", "v1beta1", "v1alpha3")
"""resource.k8s.io versions that may serve DeviceTaintRule, newest first (alpha in 1.33, v1 later)."""


class DeviceTaints:
    """The drains of one provider's cluster; the served version is asked once."""

    def __init__(self, provider: KubernetesComputeResourceProvider) -> None:
        self.provider = provider
        self._asked = False
        self._version: str | None = None

    async def version(self) -> str | None:
        """The resource.k8s.io version that serves DeviceTaintRule, by API discovery; None if none does."""
        if not self._asked:
            self._asked = True
            for version in TAINT_VERSIONS:
                async with self.provider.translated():
                    answer = await self._discover(f"/apis/resource.k8s.io/{version}")
                if any(r.get("name") == "devicetaintrules" for r in (answer or {}).get("resources") or []):
                    self._version = version
                    break
        return self._version

    async def _discover(self, path: str) -> dict[str, Json] | None:
        """One discovery document, None where the server does not serve the path.

        lightkube has typed calls for objects, not for discovery documents, so
        this sends through its client (same config, auth and TLS)."""
        generic = self.provider.client._client
        response = await generic.send(generic.build_adapter_request(BasicRequest(method="GET", url=path)))
        if response.status_code == 404:
            return None
        generic.raise_for_status(response)
        answer: dict[str, Json] = response.json()
        return answer

    @staticmethod
    def resource(version: str) -> Any:
        """lightkube's typed DeviceTaintRule of that version where its models have one, else a generic one."""
        try:
            module = importlib.import_module(f"lightkube.resources.resource_{version}")
            return module.DeviceTaintRule
        except (ImportError, AttributeError):
            return create_global_resource("resource.k8s.io", version, "DeviceTaintRule", "devicetaintrules")

    async def rules(self, **labels: str) -> list[dict[str, Json]]:
        """Our DeviceTaintRules (of one group with `computegroups.io/group`); none where none are served."""
        version = await self.version()
        if version is None:
            return []
        return await self.provider._list(self.resource(version), namespaced=False, labels=k.selector(**labels))

    async def drain(self, group: Mapping[str, Json]) -> None:
        """A NoSchedule DeviceTaintRule per device of the group: the scheduler puts nothing new there."""
        version = await self.version()
        if version is None:
            raise NotSupportedByCluster(
                "drain is not supported by this cluster: it serves no DeviceTaintRule in resource.k8s.io "
                "(enable the DRADeviceTaints feature gate), and a mark the scheduler does not read would "
                "drain nothing")
        rule = self.resource(version)
        for i, device in enumerate(group["devices"]):
            doc = k.taint_rule_object(f"{group['id']}-drain-{i}", group["id"], device, f"resource.k8s.io/{version}")
            async with self.provider.translated():
                await self.provider.client.apply(rule.from_dict(doc), field_manager=FIELD_MANAGER, force=True)

    async def undrain(self, group_id: str) -> None:
        """Delete the group's rules (its claim is going)."""
        version = await self.version()
        if version is None:
            return
        rule = self.resource(version)
        for r in await self.rules(**{k.GROUP: group_id}):
            async with self.provider.translated():
                await self.provider.client.delete(rule, r["metadata"]["name"])
