"""Loaded by cgd at start when this folder is on its PYTHONPATH (see `tests.fsync_gate`).

It wraps `os.fsync` for the state journal alone, steered by files in the
folder `CG_TEST_FSYNC_GATE` names: while `hold` exists an fsync of the
journal waits (and says so in `held`); while `fail` exists it fails with
EIO, as a disk that lost the pages would. Each fsync that returned is a
line in `synced`. Nothing else changes; without the variable nothing is
wrapped.
"""

from __future__ import annotations

import errno
import os
import time
from typing import Any

_GATE = os.environ.get("CG_TEST_FSYNC_GATE")


def _install(gate: str) -> None:
    real = os.fsync

    def fsync(fd: Any) -> None:
        number = fd if isinstance(fd, int) else fd.fileno()
        try:
            name = os.path.basename(os.readlink(f"/proc/self/fd/{number}"))
        except OSError:
            name = ""
        if name != "state.journal":
            real(fd)
            return
        while os.path.exists(os.path.join(gate, "hold")):
            with open(os.path.join(gate, "held"), "w"):
                pass
            time.sleep(0.01)
        if os.path.exists(os.path.join(gate, "fail")):
            raise OSError(errno.EIO, os.strerror(errno.EIO), "state.journal")
        real(fd)
        with open(os.path.join(gate, "synced"), "a") as log:
            log.write("synced\n")

    os.fsync = fsync


if _GATE:
    _install(_GATE)
