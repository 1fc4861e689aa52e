"""A cgroup v2 per worker, where cgd can write one; the environment marks where it cannot.

A worker is everything it started. Its process group misses a child that
calls setsid, and its marks (CG_INSTANCE & co. in the environment) miss one
that also clears its environment (`env -i`); a cgroup misses nothing: the
kernel puts every child in its parent's cgroup, and no process can leave one
it may not write. So where cgd may create cgroups (as root on a unified
hierarchy, or under systemd with `Delegate=yes`) each worker gets its own:

- cgd creates `<its own cgroup>/cg-workers-<instance>/<worker key>` before the
  start; the launch shim moves itself there (one write into `cgroup.procs`)
  before it drops privileges and forks the worker;
- cgd counts the worker's processes with `cgroup.procs`, kills them all with
  `cgroup.kill`, reads `memory.current` where the memory controller is
  enabled, and removes the directory once it is empty;
- the directories are named by worker key under a directory named by the
  state, so a cgd started again finds those of the workers it adopts.

Memory is counted only where the memory controller reaches the workers, and
cgroup v2 enables a controller for children only in a cgroup that holds no
process itself. So the shipped units start cgd in a leaf of its service's
cgroup (`DelegateSubgroup=cgd`, systemd 254 and later): cgd then puts its
workers' directory beside that leaf, in the delegated cgroup, and enables
memory there. Started anywhere else (a shell, older systemd), the directory
goes inside cgd's own cgroup, where counting and killing work but memory,
for that rule, is not counted.

Elsewhere (no cgroup2 mount, a read-only one, no delegation) the marks are
all there is; the choice is made once at start (`choose_tracking`), logged and
shown by `GET /v1/health`. The hybrid layout of some hosts (cgroup2 at
`/sys/fs/cgroup/unified`, with no controllers) still counts and kills: only
memory is not reported there.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from computegroups.daemon.model.config import WorkerTracking

CGROUP_MODE = "cgroup"
LEAF = "cgd"
"""The leaf the shipped units start cgd in (`DelegateSubgroup=cgd`)."""
MARKS_MODE = "marks"


class TrackingUnavailable(RuntimeError):
    """`tracking = "cgroup"` was asked for and cgd cannot create cgroups here: the message says why."""


@dataclass(frozen=True)
class Tracking:
    """What cgd uses to find a worker's processes: `cgroup` with the directory holding one cgroup
    per worker, or `marks` with why not cgroups."""

    mode: str
    path: Path | None
    why: str
    memory: bool = False
    """Each worker's cgroup counts its memory (`memory.current`)."""

    def worker_dir(self, key: str) -> Path | None:
        """The cgroup of worker `key`; None when workers are tracked by marks."""
        return self.path / key if self.path is not None else None

    def as_dict(self) -> dict[str, str | bool | None]:
        return {"mode": self.mode, "path": str(self.path) if self.path is not None else None, "why": self.why,
                "memory": self.memory}

    def describe(self) -> str:
        """One line for cgd's start-up log."""
        if self.path is not None:
            counted = "with" if self.memory else "without"
            return f"workers are tracked by cgroup, under {self.path} ({self.why}), {counted} their memory"
        return f"workers are tracked by their environment marks: {self.why}"


MARKS_ONLY = Tracking(MARKS_MODE, None, "chosen by the caller")


def choose_tracking(wanted: WorkerTracking, instance: str) -> Tracking:
    """Decide at start, by trying: create the directory of this cgd's workers beside cgd's own
    cgroup. `instance` names the state (a cgd started again finds the same directory).
    TrackingUnavailable when cgroups were required and cannot be had."""
    if wanted == WorkerTracking.MARKS:
        return Tracking(MARKS_MODE, None, "workers.tracking is \"marks\" in the configuration")
    try:
        path = _workers_dir(instance)
    except OSError as exc:
        why = f"cgroup v2 is not writable here ({exc})"
    else:
        return Tracking(CGROUP_MODE, path, f"workers.tracking is \"{wanted.value}\"", _counts_memory(path))
    if wanted == WorkerTracking.CGROUP:
        raise TrackingUnavailable(f"workers.tracking is \"cgroup\" but {why}")
    return Tracking(MARKS_MODE, None, why)


def _workers_dir(instance: str) -> Path:
    """Created (or found, after a restart) beside cgd's own cgroup, never in it: a cgroup with
    controllers enabled for its children may hold no process itself."""
    mount = cgroup2_mount()
    if mount is None:
        raise OSError(errno.ENOENT, "no cgroup2 file system is mounted")
    own = own_cgroup()
    if own is None:
        raise OSError(errno.ENOENT, "/proc/self/cgroup has no cgroup v2 line")
    name = "cg-workers-" + hashlib.sha256(instance.encode()).hexdigest()[:12]
    base = mount / own.lstrip("/")
    if base.name == LEAF and base.parent != mount:
        base = base.parent  # DelegateSubgroup=cgd: the delegated cgroup holds no process of its own
        _enable_memory(base)
    path = base / name
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o755)
    if not (path / "cgroup.kill").exists():
        with contextlib.suppress(OSError):
            path.rmdir()
        raise OSError(errno.ENOTSUP, "the kernel has no cgroup.kill (Linux 5.14 or later has)")
    if not os.access(path / "cgroup.procs", os.W_OK):
        raise OSError(errno.EACCES, f"{path}/cgroup.procs is not writable")
    _enable_memory(path)
    return path


def _enable_memory(path: Path) -> None:
    """Let each worker's cgroup count its memory, where the controller reaches this far
    (not on hybrid hosts, nor under a parent that enables it for none of its children)."""
    try:
        if "memory" in (path / "cgroup.controllers").read_text().split():
            (path / "cgroup.subtree_control").write_text("+memory")
    except OSError:
        pass  # then memory is not reported; counting and killing work all the same


def _counts_memory(path: Path) -> bool:
    try:
        return "memory" in (path / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False


def cgroup2_mount() -> Path | None:
    """Where the unified hierarchy is mounted: /sys/fs/cgroup on pure v2 hosts,
    /sys/fs/cgroup/unified on hybrid ones."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if " - " in line and fields[fields.index("-") + 1] == "cgroup2":
            return Path(fields[4])
    return None


def own_cgroup() -> str | None:
    """cgd's cgroup in the unified hierarchy: the `0::/path` line of /proc/self/cgroup."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


def prepare(directory: Path) -> bool:
    """Create the worker's cgroup; False when it existed already (an earlier run's, maybe with
    what that run left in it)."""
    try:
        directory.mkdir()
    except FileExistsError:
        return False
    return True


def procs(directory: Path | None) -> set[int]:
    """The pids in the cgroup now; none when there is no such cgroup."""
    if directory is None:
        return set()
    try:
        return {int(pid) for pid in (directory / "cgroup.procs").read_text().split()}
    except FileNotFoundError:
        return set()


def kill(directory: Path) -> None:
    """SIGKILL every process of the cgroup, those forking meanwhile included."""
    with contextlib.suppress(FileNotFoundError):
        (directory / "cgroup.kill").write_text("1")


def remove(directory: Path | None) -> bool:
    """Remove the cgroup if it is empty; False while a process is still in it."""
    if directory is None:
        return True
    try:
        directory.rmdir()
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return False
        raise
    return True


def memory(directory: Path | None) -> int | None:
    """Bytes the worker's processes use now (`memory.current`); None where the memory controller
    is not enabled for it."""
    if directory is None:
        return None
    try:
        return int((directory / "memory.current").read_text())
    except (OSError, ValueError):
        return None


def worker_dirs(tracking: Tracking) -> list[Path]:
    """Every worker cgroup under this cgd's directory: the running ones and what earlier runs left."""
    if tracking.path is None:
        return []
    try:
        return sorted(p for p in tracking.path.iterdir() if p.is_dir())
    except FileNotFoundError:
        return []
