"""The import root `computegroups`: every part of the project is installed under it.

The repository keeps its folders (`daemon/`, `topology/`, `cli/`,
`statefiles/`); setup.cfg maps them to `computegroups.daemon`,
`computegroups.topology`, ... so that installing this project can never
overwrite another distribution's top-level `daemon` or `cli` package. This
file is the root package itself (setup.cfg maps `computegroups` here).

The short public names load on first use (PEP 562): `cgctl` imports
`computegroups.cli` and must not pay for the client library. Nothing else
is imported either (not even `typing`): every `cgctl` and every program that
imports any part of the project starts by importing this file.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False

__version__ = "0.1.0"

_PUBLIC = {
    "ComputeGroupManager": "computegroups.daemon.client.manager",
    "ComputeGroup": "computegroups.daemon.client.models",
    "ComputeNode": "computegroups.daemon.client.models",
    "CgdClient": "computegroups.daemon.client.sync",
    "AsyncCgdClient": "computegroups.daemon.client.aio",
    "CgdError": "computegroups.daemon.client.errors",
}

__all__ = [
    "AsyncCgdClient", "CgdClient", "CgdError", "ComputeGroup", "ComputeGroupManager", "ComputeNode",
    "__version__",
]

if TYPE_CHECKING:
    from typing import Any

    from computegroups.daemon.client.aio import AsyncCgdClient
    from computegroups.daemon.client.errors import CgdError
    from computegroups.daemon.client.manager import ComputeGroupManager
    from computegroups.daemon.client.models import ComputeGroup, ComputeNode
    from computegroups.daemon.client.sync import CgdClient


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'computegroups' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
