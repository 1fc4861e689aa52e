"""Deployment files the render tests share: the docs' example and one that uses every claim field."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from computegroups.daemon.model.deployment import DeploymentSpec, parse

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
GROVE_SHARING = ROOT / "docs" / "examples" / "grove-sharing.toml"
IMAGE = "python:3.12-slim"


def example() -> DeploymentSpec:
    return parse(tomllib.loads(GROVE_SHARING.read_text()), source=str(GROVE_SHARING))


def spec(claims: list[dict[str, Any]], components: list[dict[str, Any]] | None = None,
         **extra: Any) -> DeploymentSpec:
    """A one-set deployment; by default one component `w` shares every claim per replica."""
    if components is None:
        components = [{"name": "w", "command": ["run"],
                       "sharing": [{"claim": c["name"], "scope": "per-replica"} for c in claims]}]
    return parse({"name": "d", "claims": claims, "components": components, **extra})


EVERY_KIND = {
    "name": "kinds",
    "replicas": 2,
    "claims": [
        {"name": "whole", "gpus": 2, "colocate": "pcie",
         "anti_affinity": [{"component": "db", "level": "machine"}]},
        {"name": "slice", "mig": "1g.10gb", "distinct": True},
        {"name": "share", "memory": "1536MiB", "compute": 30, "distinct": True,
         "affinity": [{"component": "cache", "level": "machine"}]},
        {"name": "pinned", "gpus": 1, "gpu_ids": [3], "pool": "fast", "strategy": "spread", "priority": 5,
         "allow_busy": True, "colocate": "nvlink", "exclusive": "numa",
         "affinity": [{"component": "db", "level": "device"}]},
    ],
    "components": [
        {"name": "trainer", "command": ["python", "train.py"], "env": {"EPOCHS": "3"}, "cwd": "/work",
         "replicas": 2, "stop_timeout_s": 2.5,
         "restart": {"policy": "on-failure", "max_retries": 2, "backoff_s": 3.0},
         "sharing": [{"claim": "whole", "scope": "per-replica"}, {"claim": "slice", "scope": "all-replicas"}]},
        {"name": "eval", "command": ["python", "eval.py"], "restart": {"policy": "never"},
         "sharing": [{"claim": "share", "scope": "per-replica"}]},
        {"name": "holder"},
    ],
    "scaling_groups": [{"name": "pair", "components": ["eval", "holder"], "replicas": 3,
                        "sharing": [{"claim": "pinned", "scope": "all-replicas",
                                     "filter": {"components": ["holder"]}}]}],
}


SELECTORS = {
    "name": "selectors",
    "claims": [
        {"name": "fast", "gpus": 4, "model": "*H100*", "min_memory_mib": "80GiB", "compute_capability": "9.0",
         "same": "model", "cpus": 16},
        {"name": "either", "memory": "20GiB", "compute": 30, "share": "any", "model": "NVIDIA [AH]100*"},
        {"name": "all-of-one", "memory": "40GiB", "share": "whole", "min_memory_mib": "48GiB"},
        {"name": "just-a-share", "memory": "10GiB", "share": "share", "compute_capability": "8.0"},
        {"name": "slice", "mig": "1g.10gb", "model": "*A100*", "min_memory_mib": "40GiB"},
        {"name": "cores", "cpus": 8},
    ],
    "components": [
        {"name": "train", "command": ["python", "train.py"], "cpu_bind": "numa",
         "sharing": [{"claim": c, "scope": "per-replica"}
                     for c in ("fast", "either", "all-of-one", "just-a-share", "slice")]},
        {"name": "prep", "command": ["python", "prep.py"], "sharing": [{"claim": "cores", "scope": "all-replicas"}]},
    ],
    "sharing": [{"claim": "cores", "scope": "per-replica", "filter": {"components": ["train"]}}],
}
"""Issue 17's selectors and sharing modes, CPU-only claims and cpu_bind."""
