"""Where the state files live.

cgd, cgctl and anyone inspecting a box must find the same directory without
asking each other, so the rule lives in one place: an explicit `--state-dir`,
then `$CG_STATE_DIR`, then `/var/lib/computegroups` for root (a system
service) or the XDG state directory for a user.
"""

from __future__ import annotations

import os
from pathlib import Path

SYSTEM_STATE_DIR = Path("/var/lib/computegroups")


def default_state_dir(system: bool | None = None) -> Path:
    """`$CG_STATE_DIR`, else the mode's default; `system=None` means "am I root"."""
    override = os.environ.get("CG_STATE_DIR")
    if override:
        return Path(override)
    if system is None:
        system = os.geteuid() == 0
    if system:
        return SYSTEM_STATE_DIR
    base = os.environ.get("XDG_STATE_HOME", "")
    # The XDG spec says a relative value is invalid and must be ignored.
    if not os.path.isabs(base):
        base = str(Path.home() / ".local" / "state")
    return Path(base) / "computegroups"


def resolve_state_dir(explicit: str | os.PathLike[str] | None = None, system: bool | None = None) -> Path:
    """`--state-dir` wins over everything `default_state_dir` looks at."""
    if explicit:
        return Path(explicit)
    return default_state_dir(system)
