"""A claim as a DRA `ResourceClaimTemplate` spec (`resource.k8s.io/v1`) for NVIDIA's driver.

Device classes, attribute and capacity names are those NVIDIA's DRA driver
(NVIDIA/k8s-dra-driver-gpu, `cmd/gpu-kubelet-plugin`, Helm chart
`deviceclass-*.yaml`) publishes: whole GPUs are class `gpu.nvidia.com`, MIG
devices class `mig.nvidia.com` with the string attribute `profile`; every
GPU has `uuid` and the standard `resource.kubernetes.io/pcieRoot`; a GPU's
capacity `memory` is in bytes.

A share (`memory`, `compute`) has two forms, chosen by `sharing`:
- `dra`: a consumable-capacity request (KEP-5075, `capacity.requests`) on a
  shareable GPU, so that separate claims each consume part of one device,
  as cgd's shares do. NVIDIA's driver does not publish shareable GPUs
  today, so this form waits for a driver that does.
- `mps`: one GPU for the claim, configured through the driver's opaque
  `GpuConfig` with the MPS strategy: the share's memory as the pinned
  device memory limit and its compute as the active thread percentage of
  every process on the claim (the pods that share the claim).

Everything a claim says that has no Kubernetes form is returned as a
warning naming the file's field; nothing is dropped silently.
"""

from __future__ import annotations

from typing import Any

from computegroups.daemon.kubernetes.render_selectors import (
    PRODUCT_NAME,
    cel,
    cel_string,
    device_selectors,
    quantity,
    selector_problems,
)
from computegroups.daemon.model.claims import Claim, Level, SameAttribute, ShareMode
from computegroups.daemon.model.deployment import ClaimSpec
from computegroups.topology.model import DomainKind

DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
NVIDIA_CONFIG_API = "resource.nvidia.com/v1beta1"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
HOSTNAME = "kubernetes.io/hostname"
SHARINGS = ("dra", "mps")


def request_name(claim: Claim) -> str:
    """The one request of a claim's template: what `config.requests` and pods' claims refer to."""
    if claim.kind == "share" and claim.share is ShareMode.WHOLE:
        return "gpus"
    return {"whole": "gpus", "mig": "mig", "share": "share"}[claim.kind]


def claim_template_spec(claim: Claim, sharing: str) -> dict[str, Any]:
    """The `spec` of a ResourceClaimTemplate (and of a ResourceClaim) for `claim` (not a CPU-only one).

    A share's `share` mode: `whole` asks one whole GPU with at least the
    share's memory; `any` is DRA's prioritized list (`firstAvailable`, the
    share first, then a whole GPU), as cgd tries them in that order."""
    name = request_name(claim)
    config: list[dict[str, Any]] = []
    request: dict[str, Any] = {"name": name}
    if claim.kind == "whole":
        request["exactly"] = {"deviceClassName": GPU_CLASS, "count": claim.gpus, **_selectors(claim)}
    elif claim.kind == "mig":
        profile = cel(f"device.attributes['{DRIVER}'].profile == {cel_string(str(claim.mig))}")
        request["exactly"] = {"deviceClassName": MIG_CLASS, "selectors": [profile, *device_selectors(claim)]}
    elif claim.share is ShareMode.WHOLE:
        request["exactly"] = _whole_of(claim)
    else:
        share = {"deviceClassName": GPU_CLASS, **_selectors(claim)}
        if sharing == "dra":
            share["capacity"] = {"requests": share_capacity(claim)}
        if claim.share is ShareMode.ANY:
            request["firstAvailable"] = [{"name": "share", **share}, {"name": "whole", **_whole_of(claim)}]
        else:
            request["exactly"] = share
        if sharing == "mps":
            target = f"{name}/share" if claim.share is ShareMode.ANY else name
            config.append({"requests": [target], "opaque": {"driver": DRIVER, "parameters": mps_config(claim)}})
    devices: dict[str, Any] = {"requests": [request]}
    constraints = device_constraints(claim)
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return {"devices": devices}


def _selectors(claim: Claim, min_memory_mib: int | None = None) -> dict[str, Any]:
    found = device_selectors(claim, min_memory_mib)
    return {"selectors": found} if found else {}


def _whole_of(claim: Claim) -> dict[str, Any]:
    """A share asked as one whole GPU ("all of the device") with at least the share's memory."""
    floor = max(claim.memory_mib or 0, claim.min_memory_mib or 0) or None
    return {"deviceClassName": GPU_CLASS, "count": 1, **_selectors(claim, floor)}


def share_capacity(claim: Claim) -> dict[str, str]:
    """A share as consumable capacity: `memory` (bytes, the driver's name) and `compute` (percent of the SMs)."""
    capacity = {}
    if claim.memory_mib is not None:
        capacity["memory"] = quantity(claim.memory_mib)
    if claim.compute_pct is not None:
        capacity["compute"] = str(claim.compute_pct)
    return capacity


def mps_config(claim: Claim) -> dict[str, Any]:
    """NVIDIA's opaque `GpuConfig` for a share under MPS (api/nvidia.com/resource/v1beta1, `MpsConfig`)."""
    mps: dict[str, Any] = {}
    if claim.compute_pct is not None:
        mps["defaultActiveThreadPercentage"] = claim.compute_pct
    if claim.memory_mib is not None:
        mps["defaultPinnedDeviceMemoryLimit"] = quantity(claim.memory_mib)
    return {"apiVersion": NVIDIA_CONFIG_API, "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": mps}}


def device_constraints(claim: Claim) -> list[dict[str, Any]]:
    """The claim's rules between its devices, as DRA constraints.

    `same = "model"` is a `matchAttribute` on the driver's `productName`;
    `distinct` a `distinctAttribute` on the physical GPU (a MIG device's
    parent); `colocate = "pcie"` a `matchAttribute` on the PCIe root.
    """
    constraints: list[dict[str, Any]] = []
    if claim.same is SameAttribute.MODEL:
        constraints.append({"matchAttribute": PRODUCT_NAME})
    if claim.distinct and claim.kind != "whole":  # whole GPUs of one claim are distinct devices anyway
        attribute = "parentUUID" if claim.kind == "mig" else "uuid"
        constraints.append({"distinctAttribute": f"{DRIVER}/{attribute}"})
    if claim.colocate is DomainKind.PCIE:
        constraints.append({"matchAttribute": PCIE_ROOT})
    return constraints


def pod_affinity(claim: Claim, label: str) -> dict[str, Any]:
    """The pod (anti-)affinity of the claim's users: terms at the `machine` level, on the node's hostname.

    `label` is the pod label that carries a component's name. The other
    levels have no node label to name (see `claim_warnings`).
    """
    def terms(entries: tuple[Any, ...]) -> list[dict[str, Any]]:
        return [{"labelSelector": {"matchLabels": {label: t.component}}, "topologyKey": HOSTNAME}
                for t in entries if t.level is Level.MACHINE]

    out: dict[str, Any] = {}
    for key, entries in (("podAffinity", claim.affinity), ("podAntiAffinity", claim.anti_affinity)):
        found = terms(entries)
        if found:
            out[key] = {"requiredDuringSchedulingIgnoredDuringExecution": found}
    return out


def claim_warnings(spec: ClaimSpec, path: str, per_replica: bool, all_replicas: bool = False) -> list[str]:
    """What `spec` (the file's claim at `path`) says that the rendered claim does not carry.

    Its `cpus` are rendered, as the CPU request of the containers that use it (render.py); only
    a claim shared by all replicas counts them differently: once on one box, in each pod on a cluster.
    """
    claim = spec.claim
    out = []
    if claim.cpus is not None and all_replicas:
        out.append(f"{path}.cpus: shared by all replicas, counted once by cgd; on Kubernetes each pod "
                   "that uses it requests them (resources.requests.cpu is a container's own)")
    for key, why in selector_problems(claim).items():
        out.append(f"{path}.{key}: {why}; not rendered")
    if claim.gpu_ids is not None:
        out.append(f"{path}.gpu_ids: pinned GPU indices have no Kubernetes form "
                   "(the scheduler picks the devices); not rendered")
    if claim.pool is not None:
        out.append(f"{path}.pool: local pools have no Kubernetes form "
                   "(a node selector or a device class does that on a cluster); not rendered")
    if claim.strategy is not None:
        out.append(f"{path}.strategy: binpack or spread is the scheduler's choice on Kubernetes; not rendered")
    if claim.priority:
        out.append(f"{path}.priority: claims have no priority on Kubernetes (pods take a priorityClassName); "
                   "not rendered")
    if claim.allow_busy:
        out.append(f"{path}.allow_busy: the DRA driver owns its devices; not rendered")
    if claim.colocate in (DomainKind.NVLINK, DomainKind.NUMA):
        out.append(f"{path}.colocate: NVIDIA's DRA driver publishes no {claim.colocate.value} attribute to "
                   "match devices on; not rendered")
    if claim.exclusive is not None:
        out.append(f"{path}.exclusive: holding a {claim.exclusive.value} domain alone has no Kubernetes "
                   "form; not rendered")
    for key in ("affinity", "anti_affinity"):
        for i, term in enumerate(getattr(claim, key)):
            if term.level is not Level.MACHINE:
                out.append(f"{path}.{key}[{i}]: level {term.level.value} has no node label to match pods on "
                           "(only machine does, as kubernetes.io/hostname); not rendered")
    if claim.distinct and claim.kind != "whole" and per_replica:
        out.append(f"{path}.distinct: rendered inside each claim; the separate claims of its replicas are "
                   "not kept on different GPUs by Kubernetes")
    return out
