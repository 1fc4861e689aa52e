"""NVML -> the `Machine` model, on real boxes and simulated ones alike.

The names below load on first use (PEP 562): importing `topology.model` for
the dataclasses must not pay for pynvml and discovery, which every `cgctl`
command would otherwise do at start-up.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SIMULATE_ENV": "topology.machines_api",
    "load_machine": "topology.machines_api",
    "open_gateway": "topology.machines_api",
    "simulated_gateway": "topology.machines_api",
    "MachineFileError": "topology.machinefile",
    "simulated_machine_names": "topology.machinefile",
    "NvmlUnavailable": "topology.nvml",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'topology' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
