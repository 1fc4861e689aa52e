"""Which cgd a client talks to when it is not told.

A user's own cgd (user mode) comes first; on a shared box where only the
system cgd runs, a user who never set `CG_SOCKET` still finds it, as long
as its socket exists (its mode decides whether the user may talk to it).
"""

from __future__ import annotations

import os
from pathlib import Path

from computegroups.daemon.paths import socket_path


def client_socket_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """`explicit`, then `$CG_SOCKET`, then the caller's own cgd, then the system cgd."""
    if explicit or os.environ.get("CG_SOCKET"):
        return socket_path(explicit)
    own = socket_path()
    system = socket_path(system=True)
    if own != system and not own.exists() and system.exists():
        return system
    return own
