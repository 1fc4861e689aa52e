"""From the state document to the exact worker a replica should run.

The manager decides *that* a replica runs; this module decides *how*: argv,
environment, identity and log files are a pure function of the state, so a
worker started after a crash is the same worker that was asked for.
"""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from computegroups.daemon.model.config import CpuBindDefault, DaemonConfig
from computegroups.daemon.model.enums import CpuBind
from computegroups.daemon.model.refs import ReplicaRef
from computegroups.daemon.model.requests import ComponentRequest, ComponentSpec
from computegroups.daemon.paths import RUNTIME_MODE, own_dir
from computegroups.daemon.supervision.supervisor import RestartPolicy, WorkerSpec
from computegroups.daemon.supervision.workerenv import (
    MpsSettings,
    VisibleDevice,
    merge_devices,
    owner_env,
    worker_env,
)
from computegroups.daemon.supervision.worklogs import log_paths
from computegroups.statefiles.schema import ComponentRecord, GroupRecord, StateDoc
from computegroups.topology.model import Machine

INSTANCE_VAR = "CG_INSTANCE"


def replica_ref(component: str, replica: int) -> str:
    """How a replica is named in a group's users and in the worker table."""
    return str(ReplicaRef(component, replica))


def watcher_key(component: str, replica: int) -> str:
    """The supervisor's name for a replica's worker: stable across role swaps."""
    return f"{component}.{replica}"


def parse_watcher_key(key: str) -> tuple[str, int]:
    component, _, replica = key.rpartition(".")
    return component, int(replica)


def replica_groups(doc: StateDoc, component: str, replica: int) -> list[GroupRecord]:
    ref = replica_ref(component, replica)
    return sorted((g for g in doc.groups.values() if ref in g.users), key=lambda g: g.id)


def visible_devices(groups: list[GroupRecord]) -> list[VisibleDevice]:
    """What a replica may use: each device of its groups once, with the sum of its shares there."""
    merged = merge_devices(
        VisibleDevice(gpu_index=dev.gpu_index, gpu_uuid=dev.gpu_uuid, mig_uuid=dev.mig_uuid,
                      memory_mib=dev.memory_mib, compute_pct=dev.compute_pct, whole=dev.whole)
        for group in groups for dev in group.devices
    )
    return sorted(merged, key=lambda d: (d.gpu_index, d.mig_uuid or ""))


def groups_by_replica(doc: StateDoc) -> dict[str, list[GroupRecord]]:
    """Every replica's groups at once, for views over all workers (one pass over the groups)."""
    out: dict[str, list[GroupRecord]] = {}
    for g in sorted(doc.groups.values(), key=lambda g: g.id):
        for ref in g.users:
            out.setdefault(ref, []).append(g)
    return out


@dataclass(frozen=True)
class WorkerPaths:
    log_dir: Path
    runtime_dir: Path
    instance: str

    def role_file(self, component: str, replica: int) -> Path:
        return self.runtime_dir / "roles" / f"{component}.{replica}"


def cpu_bind_mode(machine: Machine, config: DaemonConfig, spec: ComponentSpec) -> CpuBind:
    """The component's own `cpu_bind`, else cgd's default (`auto`: NUMA-local where there is
    more than one NUMA node, as Slurm's --cpu-bind and NVIDIA's tuning guides advise)."""
    if spec.cpu_bind is not None:
        return spec.cpu_bind
    if config.cpu_bind == CpuBindDefault.AUTO:
        return CpuBind.NUMA if len(machine.numa_nodes) > 1 else CpuBind.NONE
    return CpuBind(config.cpu_bind.value)


def cpu_binding(machine: Machine, devices: list[VisibleDevice], mode: CpuBind) -> tuple[int, ...]:
    """The CPUs local to a replica's GPUs (NVML's CPU affinity of each), their union when its
    devices span NUMA nodes; () when it is not bound (mode `none`, no device, or unknown)."""
    if mode != CpuBind.NUMA:
        return ()
    cpus: set[int] = set()
    for d in devices:
        try:
            cpus.update(machine.gpu(d.gpu_index).cpu_affinity or ())
        except KeyError:  # a GPU gone since: its CPUs are unknown
            continue
    return tuple(sorted(cpus))


Binding = Callable[[ComponentRecord, list[VisibleDevice]], tuple[int, ...]]
"""A replica's CPU binding from its component and devices (`binder`): what views show."""


def binder(machine: Machine, config: DaemonConfig) -> Binding:
    return lambda comp, devices: cpu_binding(machine, devices, cpu_bind_mode(machine, config, comp.spec))


def replica_cpus(doc: StateDoc, machine: Machine, config: DaemonConfig, comp: ComponentRecord,
                 replica: int) -> tuple[int, ...]:
    return binder(machine, config)(comp, visible_devices(replica_groups(doc, comp.name, replica)))


def build_env(
    doc: StateDoc, comp: ComponentRecord, replica: int, role: str,
    paths: WorkerPaths, config: DaemonConfig, machine: Machine,
) -> dict[str, str]:
    request = ComponentRequest.from_spec(comp.name, comp.spec)
    groups = replica_groups(doc, comp.name, replica)
    mps = MpsSettings(str(paths.runtime_dir / "mps")) if config.mps else None
    devices = visible_devices(groups)
    return worker_env(
        owner=owner_env(comp.owner_uid, comp.owner_gid),
        devices=devices,
        component=comp.name,
        replica=replica,
        role=role,
        groups=[g.id for g in groups],
        role_file=str(paths.role_file(comp.name, replica)),
        naming=config.device_naming,
        mps=mps,
        extra=request.env,
        instance=paths.instance,
        cpus=cpu_binding(machine, devices, cpu_bind_mode(machine, config, comp.spec)),
    )


def build_spec(
    doc: StateDoc, comp: ComponentRecord, replica: int, role: str,
    paths: WorkerPaths, config: DaemonConfig, machine: Machine,
) -> WorkerSpec:
    request = ComponentRequest.from_spec(comp.name, comp.spec)
    assert request.command is not None
    argv = ("/bin/sh", "-c", request.command[0]) if request.shell else request.command
    env = build_env(doc, comp, replica, role, paths, config, machine)
    stdout, stderr = log_paths(paths.log_dir, comp.name, replica)
    return WorkerSpec(
        key=watcher_key(comp.name, replica),
        argv=tuple(argv),
        env=env,
        cwd=request.cwd or env.get("HOME") or "/",
        uid=comp.owner_uid,
        gid=comp.owner_gid,
        stdout_path=str(stdout),
        stderr_path=str(stderr),
        restart=RestartPolicy(
            mode=request.restart.mode, max_retries=request.restart.max_retries,
            backoff_s=request.restart.backoff_s,
        ),
        stop_timeout_s=request.stop_timeout_s,
        stop_signal=signal.SIGTERM,
        shell=request.shell,
        cpus=replica_cpus(doc, machine, config, comp, replica),
    )


ROLE_FILE_MODE = 0o644
"""The worker, maybe another user, reads it; only cgd writes it."""


def write_role(paths: WorkerPaths, component: str, replica: int, role: str, uid: int, gid: int) -> None:
    """Write the role file atomically: a worker reading it never sees it empty.

    cgd may be root, so nothing here follows a symlink: roles/ must be cgd's
    own directory, the temporary file gets a fresh unguessable name and is
    created exclusively, and it is chowned through its descriptor.
    """
    target = paths.role_file(component, replica)
    own_dir(target.parent, RUNTIME_MODE)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, ROLE_FILE_MODE)
    try:
        try:
            _fill_role_file(fd, role, uid, gid)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _fill_role_file(fd: int, role: str, uid: int, gid: int) -> None:
    """The role, the mode whatever the umask, and the worker's ownership."""
    data = (role + "\n").encode()
    while data:
        data = data[os.write(fd, data):]
    os.fchmod(fd, ROLE_FILE_MODE)
    if os.geteuid() == 0:
        os.fchown(fd, uid, gid)
