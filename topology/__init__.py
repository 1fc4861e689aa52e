"""NVML -> the `Machine` model, on real boxes and simulated ones alike.

The names below load on first use (PEP 562): importing `computegroups.topology.model` for
the dataclasses must not pay for pynvml and discovery, which every `cgctl`
command would otherwise do at start-up.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SIMULATE_ENV": "computegroups.topology.machines_api",
    "load_machine": "computegroups.topology.machines_api",
    "open_gateway": "computegroups.topology.machines_api",
    "simulated_gateway": "computegroups.topology.machines_api",
    "MachineFileError": "computegroups.topology.machinefile",
    "simulated_machine_names": "computegroups.topology.machinefile",
    "NvmlUnavailable": "computegroups.topology.nvml",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'computegroups.topology' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
