"""Python clients of cgd.

- `CgdClient`: blocking, one method per route of docs/api.md (what `cgctl` uses).
- `AsyncCgdClient`: the same routes, awaitable.
- `ComputeGroupManager`, `ComputeGroup`, `ComputeNode`,
  `ComputeResourceProvider`, `LocalComputeResourceProvider`: the same API on any provider.

The async names load on first use (PEP 562) so that `cgctl`, which needs only
`CgdClient`, does not pay for importing asyncio on every start.
"""

from __future__ import annotations

import importlib
from typing import Any

from computegroups.daemon.client.errors import CgdError, CgdNotRunning, CgdStopping, CgdUnreachable, ClientError
from computegroups.daemon.client.sync import CgdClient

_LAZY = {
    "AsyncCgdClient": "computegroups.daemon.client.aio",
    "ComputeGroupManager": "computegroups.daemon.client.manager",
    "ComputeGroup": "computegroups.daemon.client.models",
    "ComputeNode": "computegroups.daemon.client.models",
    "ComputeResourceProvider": "computegroups.daemon.client.providers",
    "LocalComputeResourceProvider": "computegroups.daemon.client.providers",
}

__all__ = [
    "AsyncCgdClient", "CgdClient", "CgdError", "CgdNotRunning", "CgdStopping", "CgdUnreachable", "ClientError",
    "ComputeGroup", "ComputeGroupManager", "ComputeNode", "ComputeResourceProvider",
    "LocalComputeResourceProvider",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
