"""The one door to NVML.

Only this module imports `pynvml`: everything else reaches the driver through
an `NvmlGateway`, which can wrap the real binding or the fake of
`computegroups.topology.fakenvml`, so discovery and telemetry run the same code on a real
box and on a simulated one. NVML is started lazily and once (under a lock, as
several daemon threads may sample at the same time) and shut down at close or
at interpreter exit. `query` turns "this GPU cannot tell" into a default, so a
field a GPU does not support degrades that field alone.
"""

from __future__ import annotations

import atexit
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
from pynvml import (
    NVMLError,
    NVMLError_DriverNotLoaded,
    NVMLError_FunctionNotFound,
    NVMLError_GpuIsLost,
    NVMLError_InvalidArgument,
    NVMLError_LibraryNotFound,
    NVMLError_NoPermission,
    NVMLError_NotFound,
    NVMLError_NotSupported,
    NVMLError_Timeout,
    NVMLError_Uninitialized,
    NVMLError_Unknown,
)

from computegroups.topology.machinefile import simulated_machine_names

__all__ = [
    "UNSUPPORTED",
    "NVMLError",
    "NVMLError_DriverNotLoaded",
    "NVMLError_FunctionNotFound",
    "NVMLError_GpuIsLost",
    "NVMLError_InvalidArgument",
    "NVMLError_LibraryNotFound",
    "NVMLError_NoPermission",
    "NVMLError_NotFound",
    "NVMLError_NotSupported",
    "NVMLError_Timeout",
    "NVMLError_Uninitialized",
    "NVMLError_Unknown",
    "NvmlGateway",
    "NvmlUnavailable",
    "real_binding",
]

UNSUPPORTED: tuple[type[NVMLError], ...] = (
    NVMLError_NotSupported,
    NVMLError_InvalidArgument,
    NVMLError_NoPermission,
    NVMLError_FunctionNotFound,
)
"""Errors that mean "this GPU (or driver) cannot tell", not "this GPU is broken"."""


class NvmlUnavailable(RuntimeError):
    """No usable NVML on this box; the message says how to simulate one instead."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"NVML is not available ({reason}); to run without an NVIDIA driver use "
            f"--simulate NAME or CG_SIMULATE=NAME, NAME one of: "
            + ", ".join(simulated_machine_names())
            + ", or the path of a machine file"
        )
        self.reason = reason


def real_binding() -> Any:
    """The `pynvml` module itself, for the fake to borrow constants and structures from."""
    return pynvml


class NvmlGateway:
    """A started-on-demand NVML with query-with-default.

    `source` and `hostname` travel with the gateway because a simulated
    machine has its own; `sysfs_root` is where discovery may read what NVML
    cannot tell (None on simulated machines, whose GPUs this host's sysfs
    knows nothing about).
    """

    def __init__(
        self,
        lib: Any | None = None,
        *,
        source: str = "nvml",
        hostname: str | None = None,
        sysfs_root: Path | None = Path("/sys"),
    ) -> None:
        self._lib = lib if lib is not None else pynvml
        self.source = source
        self.hostname = hostname if hostname is not None else socket.gethostname()
        self.sysfs_root = sysfs_root
        self._lock = threading.Lock()
        self._started = False
        self._closed = False

    @property
    def lib(self) -> Any:
        """The binding, NVML started; raises NvmlUnavailable when it cannot be."""
        if not self._started:
            self.start()
        return self._lib

    def start(self) -> None:
        """Start NVML now (idempotent); raises NvmlUnavailable when it cannot be."""
        with self._lock:
            if self._closed:
                raise NvmlUnavailable("the gateway was closed")
            if self._started:
                return
            try:
                self._lib.nvmlInit()
            except NVMLError as err:
                raise NvmlUnavailable(str(err)) from None
            except OSError as err:
                raise NvmlUnavailable(f"cannot load the NVML library: {err}") from None
            self._started = True
            atexit.register(self.close)

    def call(self, fn: str | Callable[..., Any], *args: Any) -> Any:
        """Call an NVML function by name; every NVMLError reaches the caller."""
        lib = self.lib
        if isinstance(fn, str):
            func = getattr(lib, fn, None)
            if func is None:
                raise NVMLError_FunctionNotFound()
            return func(*args)
        return fn(*args)

    def query(self, fn: str | Callable[..., Any], *args: Any, default: Any = None) -> Any:
        """`call`, but "cannot tell" (unsupported, no permission, missing) gives `default`."""
        try:
            return self.call(fn, *args)
        except UNSUPPORTED:
            return default

    def constant(self, name: str) -> Any:
        """An `NVML_*` constant of the wrapped binding (the fake exposes the same)."""
        return getattr(self._lib, name)

    def pci_numa_node(self, bus_id: str) -> int | None:
        """The kernel's NUMA node for a PCI device, for drivers whose NVML cannot tell."""
        if self.sysfs_root is None:
            return None
        try:
            domain, bus, device = bus_id.strip().lower().split(":")
            sysfs_id = f"{int(domain, 16):04x}:{bus}:{device}"
            text = (self.sysfs_root / "bus" / "pci" / "devices" / sysfs_id / "numa_node").read_text()
            node = int(text.strip())
        except (OSError, ValueError):
            return None
        return node if node >= 0 else None

    def close(self) -> None:
        """Shut NVML down once; later use of this gateway raises NvmlUnavailable."""
        with self._lock:
            self._closed = True
            if not self._started:
                return
            self._started = False
            atexit.unregister(self.close)
            try:
                self._lib.nvmlShutdown()
            except NVMLError:
                # The driver went away first (e.g. unloaded at exit): nothing left to release.
                return

    def __enter__(self) -> NvmlGateway:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
