"""Device selectors: which GPUs a claim may use at all, by what the GPU is.

DRA selects devices by their attributes and capacity with CEL expressions;
a claim here names the few that matter on one box: the model (a glob over
NVML's name, its vendor words optional: topology/names.py), a minimum
total memory and a minimum compute capability. They narrow the GPUs a
claim may use before any search runs, like `pool` and `gpu_ids` do.
"""

from __future__ import annotations

import re

from computegroups.daemon.model.claims import Claim
from computegroups.topology.model import Gpu, Machine
from computegroups.topology.names import model_matches


def has_selectors(claim: Claim) -> bool:
    return claim.model is not None or claim.min_memory_mib is not None or claim.compute_capability is not None


def selected(machine: Machine, claim: Claim) -> frozenset[int] | None:
    """The GPUs the claim's selectors admit; None when it has none (every GPU)."""
    if not has_selectors(claim):
        return None
    return frozenset(g.index for g in machine.gpus if matches(g, claim))


def matches(gpu: Gpu, claim: Claim) -> bool:
    if claim.model is not None and not model_matches(gpu.name, claim.model):
        return False
    if claim.min_memory_mib is not None and (gpu.memory_mib or 0) < claim.min_memory_mib:
        return False
    if claim.compute_capability is not None:
        major, minor = (int(p) for p in claim.compute_capability.split("."))
        if gpu.compute_capability is None or gpu.compute_capability < (major, minor):
            return False
    return True


def selector_text(claim: Claim) -> str:
    """The selectors in words, for refusals: `model '*A100*', memory >= 40GiB`."""
    parts = []
    if claim.model is not None:
        parts.append(f"model {claim.model!r}")
    if claim.min_memory_mib is not None:
        mib = claim.min_memory_mib
        parts.append(f"memory >= {mib // 1024}GiB" if mib % 1024 == 0 else f"memory >= {mib}MiB")
    if claim.compute_capability is not None:
        parts.append(f"compute capability >= {claim.compute_capability}")
    return ", ".join(parts)


def gpu_kinds(machine: Machine) -> str:
    """The kinds of GPU the machine has, for a refusal: `NVIDIA L40S (45GiB, 8.9)`."""
    kinds = sorted({(g.name, g.memory_mib or 0, g.compute_capability) for g in machine.gpus})
    return ", ".join(f"{name} ({mib // 1024}GiB, {'.'.join(map(str, cc)) if cc else 'unknown'})"
                     for name, mib, cc in kinds) or "no GPU"


def model_hint(machine: Machine, claim: Claim) -> str:
    """`; did you mean '*A100*80GB*'?`: a glob near the claim's that a GPU of the machine matches
    (its words with `*` around them, then between them too: the model as `cgctl status` shows it
    is NVML's name with words left out), or nothing."""
    if claim.model is None:
        return ""
    words = [w for w in re.split(r"[\s*]+", claim.model) if w]
    for glob in ("*" + " ".join(words) + "*", "*" + "*".join(words) + "*"):
        if words and glob != claim.model and any(model_matches(g.name, glob) for g in machine.gpus):
            return f"; did you mean {glob!r}?"
    return ""
