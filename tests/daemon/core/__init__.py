"""Helpers shared by the core's end-to-end tests."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def shared_kv_deployment(directory: Path) -> Path:
    """Deployment `d`: one component `x` (a sleeper) sharing the claim `kv` (1 GiB) across its replicas,
    so its group is `d-0-x-all-kv`."""
    path = directory / "d.toml"
    path.write_text(
        'name = "d"\n[[claims]]\nname = "kv"\nmemory = "1GiB"\n'
        f'[[components]]\nname = "x"\ncommand = [{json.dumps(sys.executable)}, "-c", "import time; time.sleep(3600)"]\n'
        'sharing = [{ claim = "kv", scope = "all-replicas" }]\n')
    return path
