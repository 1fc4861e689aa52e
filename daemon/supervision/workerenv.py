"""The environment every worker starts with, built from its compute group.

A worker learns which GPUs it may use only from its environment, so the
rules for `CUDA_VISIBLE_DEVICES` live in exactly one function here
(`worker_env`). Nothing in this module reads or changes `os.environ` except
`owner_env`, which only reads `LANG`.
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from computegroups.daemon.model.requests import check_env
from computegroups.topology.ranges import format_ranges

ROLES = ("primary", "shadow")
NAMINGS = ("indices", "uuid")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class VisibleDevice:
    """One device a worker may use: a whole GPU, a MIG instance, or a share of either."""

    gpu_index: int
    gpu_uuid: str
    mig_uuid: str | None
    memory_mib: int
    compute_pct: int
    whole: bool


@dataclass(frozen=True)
class OwnerEnv:
    """Who a worker runs as, and the few variables it inherits from that user."""

    uid: int
    gid: int
    user: str
    home: str
    path: str
    lang: str | None


@dataclass(frozen=True)
class MpsSettings:
    """Where the MPS control daemon cgd started listens (see daemon/mps.py)."""

    pipe_directory: str


def owner_env(uid: int, gid: int) -> OwnerEnv:
    """The owner's identity from the password database.

    PATH is a fixed system path plus `~/.local/bin` (where `pip install --user`
    puts programs) rather than the daemon's PATH: a root daemon's PATH says
    nothing about what a user expects to run. LANG is the daemon's, or
    C.UTF-8, so workers never start in the ASCII C locale.
    """
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        raise ValueError(f"uid {uid} has no entry in the password database") from None
    home = entry.pw_dir or "/"
    local_bin = os.path.join(home, ".local", "bin")
    return OwnerEnv(
        uid=uid, gid=gid, user=entry.pw_name, home=home,
        path=f"{local_bin}:{SYSTEM_PATH}", lang=os.environ.get("LANG") or "C.UTF-8",
    )


def worker_env(
    *,
    owner: OwnerEnv,
    devices: Sequence[VisibleDevice],
    component: str,
    replica: int,
    role: str,
    groups: Sequence[str],
    role_file: str,
    naming: str = "indices",
    mps: MpsSettings | None = None,
    extra: Mapping[str, str] = {},
    instance: str | None = None,
    cpus: Sequence[int] = (),
) -> dict[str, str]:
    """The complete environment of one worker: nothing else is inherited.

    `instance` (cgd's state directory) is set as CG_INSTANCE so that a later
    cgd can find this worker and its children after a crash, even ones the
    state never recorded. `cpus`, the CPUs the worker is bound to (those
    local to its GPUs), is CG_CPUS in the kernel's list format (`0-55,112-167`);
    unset when it is not bound.

    CUDA_VISIBLE_DEVICES names the devices in the order given:

    - whole GPUs and GPU shares by NVML index with `naming="indices"`, or by
      `GPU-` UUID with `naming="uuid"`; CUDA_DEVICE_ORDER=PCI_BUS_ID is always
      set, because NVML indices follow PCI bus order while CUDA's default
      order is fastest-first, and the two disagree on mixed machines;
    - MIG instances always by their `MIG-` UUID, the only name CUDA accepts;
    - no devices at all gives an empty CUDA_VISIBLE_DEVICES, which hides
      every GPU (unset would show them all).

    A device listed twice (a replica in two groups on one device) appears
    once: shares add up, a whole device wins.

    When any device is a share (not whole), CG_GPU_MEMORY_MIB and
    CG_GPU_COMPUTE_PCT tell the worker its budget: one number for one device,
    else a comma list in CUDA_VISIBLE_DEVICES order (whole devices listed
    with their full memory and 100). With MPS the driver enforces the share:
    CUDA_MPS_PINNED_DEVICE_MEM_LIMIT is a comma list of
    `<ordinal>=<MiB>M`, the ordinal being the device's position as the worker
    sees it (0 is the first entry of CUDA_VISIBLE_DEVICES), for share
    devices only; CUDA_MPS_ACTIVE_THREAD_PERCENTAGE is one number for the
    whole client, so it is the smallest compute share. Workers holding only
    whole devices are kept off MPS.

    `extra` (the request's env) may add or replace anything but what the
    model's one rule refuses (`requests.env_problem`): the variables cgd sets
    from the group, which would let a worker lie about its GPUs (other
    CUDA_* ones, CUDA_HOME say, are the user's), and, for a worker that runs
    as root, the dynamic loader's. Every worker's environment is made here,
    so whatever path asked for it (a request, a deployment, a state written
    before a rule existed) cannot get past the rule.

    >>> ada = OwnerEnv(1000, 1000, "ada", "/home/ada", "/usr/bin:/bin", "C.UTF-8")
    >>> gpu = VisibleDevice(3, "GPU-aa", None, 81559, 100, True)
    >>> env = worker_env(owner=ada, devices=[gpu], component="web", replica=0,
    ...                  role="primary", groups=["web-0"], role_file="/run/r")
    >>> env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"], env["CG_GROUP"]
    ('3', 'PCI_BUS_ID', 'web-0')
    >>> mig = VisibleDevice(1, "GPU-bb", "MIG-cc", 10240, 100, True)
    >>> worker_env(owner=ada, devices=[mig], component="web", replica=0, role="primary",
    ...            groups=["web-0"], role_file="/run/r")["CUDA_VISIBLE_DEVICES"]
    'MIG-cc'
    >>> half = VisibleDevice(2, "GPU-dd", None, 40960, 50, False)
    >>> env = worker_env(owner=ada, devices=[half], component="web", replica=1,
    ...                  role="shadow", groups=["web-1"], role_file="/run/r", naming="uuid",
    ...                  mps=MpsSettings("/run/mps"))
    >>> [env[k] for k in ("CUDA_VISIBLE_DEVICES", "CG_GPU_MEMORY_MIB",
    ...  "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")]
    ['GPU-dd', '40960', '0=40960M', '50']
    >>> memory_only = VisibleDevice(2, "GPU-dd", None, 1024, 0, False)
    >>> env = worker_env(owner=ada, devices=[memory_only], component="web", replica=0, role="primary",
    ...                  groups=["web-0"], role_file="/run/r", mps=MpsSettings("/run/mps"))
    >>> env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in env
    ('0=1024M', False)
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if naming not in NAMINGS:
        raise ValueError(f"naming must be one of {', '.join(NAMINGS)}, got {naming!r}")
    if replica < 0:
        raise ValueError(f"replica must be >= 0, got {replica}")
    _check_extra(extra, as_root=owner.uid == 0)
    merged = merge_devices(devices)

    env = {"PATH": owner.path, "HOME": owner.home, "USER": owner.user}
    if owner.lang is not None:
        env["LANG"] = owner.lang
    env.update(extra)
    env.update({
        "CUDA_VISIBLE_DEVICES": cuda_visible_devices(merged, naming),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CG_COMPONENT": component,
        "CG_REPLICA": str(replica),
        "CG_GROUP": ",".join(groups),
        "CG_ROLE": role,
        "CG_ROLE_FILE": role_file,
    })
    if instance is not None:
        env["CG_INSTANCE"] = instance
    if cpus:
        env["CG_CPUS"] = format_ranges(cpus)
    shares = [(ordinal, d) for ordinal, d in enumerate(merged) if not d.whole]
    if shares:
        env["CG_GPU_MEMORY_MIB"] = ",".join(str(d.memory_mib) for d in merged)
        env["CG_GPU_COMPUTE_PCT"] = ",".join(str(d.compute_pct) for d in merged)
        if mps is not None:
            env["CUDA_MPS_PIPE_DIRECTORY"] = mps.pipe_directory
            limited = [d.compute_pct for _, d in shares if d.compute_pct > 0]
            if limited:  # a memory-only share (compute 0) leaves the SMs unlimited; MPS takes 1-100
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(min(limited))
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
                f"{ordinal}={d.memory_mib}M" for ordinal, d in shares
            )
    return env


def cuda_visible_devices(devices: Sequence[VisibleDevice], naming: str = "indices") -> str:
    """The CUDA_VISIBLE_DEVICES value alone (for views and `cgctl env`),
    by the rules documented in `worker_env`.

    >>> cuda_visible_devices([VisibleDevice(4, "GPU-ee", None, 1, 100, True),
    ...                       VisibleDevice(1, "GPU-ff", "MIG-gg", 1, 100, True)], "uuid")
    'GPU-ee,MIG-gg'
    """
    if naming not in NAMINGS:
        raise ValueError(f"naming must be one of {', '.join(NAMINGS)}, got {naming!r}")
    return ",".join(_device_name(d, naming) for d in merge_devices(devices))


def _device_name(device: VisibleDevice, naming: str) -> str:
    if device.mig_uuid is not None:
        return device.mig_uuid
    return device.gpu_uuid if naming == "uuid" else str(device.gpu_index)


def merge_devices(devices: Iterable[VisibleDevice]) -> list[VisibleDevice]:
    """Each physical device once, in first-seen order: shares add up, a whole device wins.

    A replica can reach one GPU through several groups (its own share and a
    share of a group it is attached to); its budget on that GPU is the sum
    of them. This is the one place that sum is made, so the environment, the
    API's views, MPS limits and the health check never disagree.
    """
    merged: dict[tuple[str, str | None], VisibleDevice] = {}
    for device in devices:
        key = (device.gpu_uuid, device.mig_uuid)
        seen = merged.get(key)
        if seen is None:
            merged[key] = device
        elif seen.whole or device.whole:
            merged[key] = seen if seen.whole else device
        else:
            merged[key] = VisibleDevice(
                gpu_index=seen.gpu_index, gpu_uuid=seen.gpu_uuid, mig_uuid=seen.mig_uuid,
                memory_mib=seen.memory_mib + device.memory_mib,
                compute_pct=min(100, seen.compute_pct + device.compute_pct), whole=False,
            )
    return list(merged.values())


def _check_extra(extra: Mapping[str, str], *, as_root: bool) -> None:
    check_env(extra, as_root=as_root)
    for key, value in extra.items():
        if not _ENV_KEY.fullmatch(key):
            raise ValueError(f"env: {key!r} is not a valid variable name")
        if "\0" in value:
            raise ValueError(f"env: {key}: value must be a string without NUL bytes")
