"""Where cgd puts its socket, runtime files and logs.

cgd and cgctl must agree on these without talking to each other, so the rules
live in one place: root gets the system locations (a systemd service), anyone
else the XDG user locations, and an explicit option or variable wins.
"""

from __future__ import annotations

import os
from pathlib import Path

SOCKET_NAME = "cgd.sock"


def is_system_mode() -> bool:
    return os.geteuid() == 0


def runtime_dir(system: bool | None = None) -> Path:
    """The directory of the socket and circus's private endpoints."""
    if system is None:
        system = is_system_mode()
    if system:
        return Path("/run/computegroups")
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base:
        return Path(base) / "computegroups"
    return Path("/tmp") / f"computegroups-{os.geteuid()}"


def socket_path(explicit: str | os.PathLike[str] | None = None, system: bool | None = None) -> Path:
    """`--socket`, then `$CG_SOCKET`, then the mode's default."""
    chosen = explicit or os.environ.get("CG_SOCKET")
    if chosen:
        return Path(chosen)
    return runtime_dir(system) / SOCKET_NAME


def log_dir(explicit: str | os.PathLike[str] | None = None, system: bool | None = None) -> Path:
    """`--log-dir`, then `$CG_LOG_DIR`, then the mode's default."""
    chosen = explicit or os.environ.get("CG_LOG_DIR")
    if chosen:
        return Path(chosen)
    if system is None:
        system = is_system_mode()
    if system:
        return Path("/var/log/computegroups")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "computegroups" / "logs"
