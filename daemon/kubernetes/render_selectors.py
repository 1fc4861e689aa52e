"""A claim's device selectors as DRA CEL expressions on what NVIDIA's DRA driver publishes.

NVIDIA's driver (k8s-dra-driver-gpu, `cmd/gpu-kubelet-plugin/deviceinfo.go`)
publishes, under the domain `gpu.nvidia.com`, the string attribute
`productName`, the version attribute `cudaComputeCapability` (a semver such
as `9.0.0`) and the capacity `memory` (bytes). DRA's CEL environment has
`matches` (RE2), `lowerAscii`, `quantity()` and `semver()` with
`compareTo`; the driver's own examples select with exactly these.

cgd matches `model` as a case-blind glob over the GPU's name, its vendor
words optional (topology/names.py); here the glob becomes an anchored regex
over the lower-cased `productName` after the same optional vendor words, so
both match the same names.
"""

from __future__ import annotations

from typing import Any

from computegroups.daemon.model.claims import Claim
from computegroups.topology.names import VENDOR_PREFIX

DRIVER = "gpu.nvidia.com"
ATTRIBUTES = f"device.attributes['{DRIVER}']"
CAPACITY = f"device.capacity['{DRIVER}']"
_META = frozenset("\\.+*?()|[]{}^$")
PRODUCT_NAME = f"{DRIVER}/productName"
"""The qualified attribute `same = "model"` matches on (DRA's matchAttribute)."""


def quantity(mib: int) -> str:
    """MiB as a Kubernetes quantity, in GiB when it is a whole number of them."""
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def glob_regex(glob: str) -> str:
    """The glob as an anchored regex, with fnmatch's rules: `*`, `?`, `[seq]`, `[!seq]`;
    a `[` with no closing `]` is itself. Brackets follow CPython's `fnmatch.translate`
    (reversed ranges dropped, set operators escaped), in syntax RE2 also reads."""
    out, i, n = ["^"], 0, len(glob)
    while i < n:
        c = glob[i]
        i += 1
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c != "[":
            out.append(_literal(c))
        else:
            j = i + (i < n and glob[i] == "!")
            j += j < n and glob[j] == "]"
            while j < n and glob[j] != "]":
                j += 1
            if j >= n:
                out.append(_literal(c))
            else:
                out.append(_bracket(glob, i, j))
                i = j + 1
    out.append("$")
    return "".join(out)


def _bracket(glob: str, i: int, j: int) -> str:
    """The set `glob[i:j]` (between `[` and `]`) as a regex class."""
    stuff = glob[i:j]
    if "-" not in stuff:
        stuff = stuff.replace("\\", "\\\\")
    else:
        chunks = []
        k = i + 2 if glob[i] == "!" else i + 1
        while (k := glob.find("-", k, j)) >= 0:
            chunks.append(glob[i:k])
            i = k + 1
            k += 3
        if glob[i:j]:
            chunks.append(glob[i:j])
        else:
            chunks[-1] += "-"
        for k in range(len(chunks) - 1, 0, -1):  # a reversed range matches nothing: drop it
            if chunks[k - 1][-1] > chunks[k][0]:
                chunks[k - 1] = chunks[k - 1][:-1] + chunks[k][1:]
                del chunks[k]
        stuff = "-".join(part.replace("\\", "\\\\").replace("-", "\\-") for part in chunks)
    stuff = "".join("\\" + ch if ch in "&~|" else ch for ch in stuff)
    if not stuff:
        return "[^\\s\\S]"  # an empty set: matches nothing (RE2 has no `(?!)`)
    if stuff == "!":
        return "."
    if stuff[0] == "!":
        stuff = "^" + stuff[1:]
    elif stuff[0] in "^[":
        stuff = "\\" + stuff
    return f"[{stuff}]"


def _literal(c: str) -> str:
    """One character matched as itself. RE2 refuses an escaped letter, digit or space, so only
    its metacharacters are escaped (Python's `re.escape` escapes more)."""
    return "\\" + c if c in _META else c


def cel_string(text: str) -> str:
    """A CEL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def cel(expression: str) -> dict[str, Any]:
    return {"cel": {"expression": expression}}


def model_selector(glob: str) -> dict[str, Any]:
    return cel(f"{ATTRIBUTES}.productName.lowerAscii().matches({cel_string(model_regex(glob))})")


def model_regex(glob: str) -> str:
    """The RE2 regex a lower-cased name matches when cgd's `model_matches` says the glob does."""
    return "^" + VENDOR_PREFIX + glob_regex(glob.lower())[1:]


def memory_selector(mib: int) -> dict[str, Any]:
    return cel(f"{CAPACITY}.memory.compareTo(quantity('{quantity(mib)}')) >= 0")


def compute_capability_selector(capability: str) -> dict[str, Any]:
    major, minor = (int(p) for p in capability.split("."))
    return cel(f"{ATTRIBUTES}.cudaComputeCapability.compareTo(semver('{major}.{minor}.0')) >= 0")


def device_selectors(claim: Claim, min_memory_mib: int | None = None) -> list[dict[str, Any]]:
    """The claim's selectors (`model`, `min_memory_mib`, `compute_capability`) as CEL selectors.

    `min_memory_mib` overrides the claim's (a share asked as a whole device needs
    at least its memory). A MIG device publishes its own memory, not its GPU's,
    so a MIG claim's `min_memory_mib` has no selector (`selector_problems`)."""
    out = []
    if claim.model is not None:
        out.append(model_selector(claim.model))
    memory = min_memory_mib if min_memory_mib is not None else claim.min_memory_mib
    if memory is not None and claim.kind != "mig":
        out.append(memory_selector(memory))
    if claim.compute_capability is not None:
        out.append(compute_capability_selector(claim.compute_capability))
    return out


def selector_problems(claim: Claim) -> dict[str, str]:
    """Selector fields of the claim with no DRA form, and why."""
    if claim.kind == "mig" and claim.min_memory_mib is not None:
        return {"min_memory_mib": "a MIG device publishes its own memory, not its GPU's total, to select on"}
    return {}
