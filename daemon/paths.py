"""Where cgd puts its socket, runtime files and logs.

cgd and cgctl must agree on these without talking to each other, so the rules
live in one place: root gets the system locations (a systemd service), anyone
else the XDG user locations, and an explicit option or variable wins.

cgd, often root, writes files in its runtime directory that workers of other
users read. Anyone else who could change that directory could plant a
symlink where cgd writes, or move its socket away, so cgd keeps its files only
in directories it owns that no one else can write (see `cgd_runtime_dir`).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

SOCKET_NAME = "cgd.sock"
RUNTIME_MODE = 0o755
"""Workers of other users read their role file and reach the MPS pipes in it."""
SHARED_SUFFIX = ".d"
_WRITABLE = stat.S_IWGRP | stat.S_IWOTH


class UnsafeDirectory(PermissionError):
    """A directory cgd would keep its files in can be changed by someone else."""


def is_system_mode() -> bool:
    return os.geteuid() == 0


def runtime_dir(system: bool | None = None) -> Path:
    """The directory of the socket and cgd's runtime files. Without
    XDG_RUNTIME_DIR it is a fixed name in /tmp that anyone could create
    first: cgd refuses one that is not its own (see `cgd_runtime_dir`)."""
    if system is None:
        system = is_system_mode()
    if system:
        return Path("/run/computegroups")
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base:
        return Path(base) / "computegroups"
    return Path("/tmp") / f"computegroups-{os.geteuid()}"


def socket_path(explicit: str | os.PathLike[str] | None = None, system: bool | None = None) -> Path:
    """`--socket`, then `$CG_SOCKET`, then the mode's default."""
    chosen = explicit or os.environ.get("CG_SOCKET")
    if chosen:
        return Path(chosen)
    return runtime_dir(system) / SOCKET_NAME


def log_dir(explicit: str | os.PathLike[str] | None = None, system: bool | None = None) -> Path:
    """`--log-dir`, then `$CG_LOG_DIR`, then the mode's default."""
    chosen = explicit or os.environ.get("CG_LOG_DIR")
    if chosen:
        return Path(chosen)
    if system is None:
        system = is_system_mode()
    if system:
        return Path("/var/log/computegroups")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "computegroups" / "logs"


def cgd_runtime_dir(socket_dir: Path, socket_name: str) -> Path:
    """The directory of cgd's own runtime files (role files, MPS pipes,
    circus's endpoints) for a socket `socket_dir/socket_name`, created or
    verified.

    That is the socket's directory when it is cgd's own. In a shared sticky
    directory such as /tmp (`--socket /tmp/cgd.sock`) it is a directory of
    its own beside the socket, `<socket>.d`. Anything another user could
    change raises UnsafeDirectory.
    """
    socket_dir.parent.mkdir(parents=True, exist_ok=True)
    refuse_unsafe_ancestors(socket_dir)
    if _is_shared(socket_dir):
        own = socket_dir / f"{socket_name}{SHARED_SUFFIX}"
        own_dir(own, RUNTIME_MODE)
        return own
    own_dir(socket_dir, RUNTIME_MODE)
    return socket_dir


def own_dir(path: Path, mode: int) -> None:
    """Create `path` with exactly `mode`, or check the existing one: a real
    directory (not a symlink), owned by cgd's user, not writable by group or
    others; else UnsafeDirectory. An existing directory keeps its mode, which
    an administrator may have chosen."""
    try:
        os.mkdir(path, mode)
        created = True
    except FileExistsError:
        created = False
    fd = _open_dir(path)
    try:
        if created:
            os.fchmod(fd, mode)
        _refuse_foreign(path, os.fstat(fd))
    finally:
        os.close(fd)


def refuse_unsafe_ancestors(path: Path) -> None:
    """UnsafeDirectory if another user could replace `path` through one of
    the directories above it: writable by them, and not sticky (a sticky
    directory such as /tmp lets only an entry's owner move it).

    Both the path as written and the one its symlinks lead to are checked.
    """
    euid = os.geteuid()
    for ancestor in sorted({*path.absolute().parents, *path.resolve().parents}):
        st = os.stat(ancestor)
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in (0, euid) or (mode & _WRITABLE and not mode & stat.S_ISVTX):
            raise UnsafeDirectory(
                f"{path} is inside {ancestor}, which others can change (owner uid {st.st_uid}, mode {mode:04o})"
            )


def _is_shared(path: Path) -> bool:
    """A sticky directory that others may write, owned by root or cgd's user, like /tmp."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return (
        stat.S_ISDIR(st.st_mode) and bool(st.st_mode & stat.S_ISVTX) and bool(st.st_mode & _WRITABLE)
        and st.st_uid in (0, os.geteuid())
    )


def _open_dir(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        what = "a symbolic link" if os.path.islink(path) else "not a directory"
        raise UnsafeDirectory(f"{path} is {what}") from None


def _refuse_foreign(path: Path, st: os.stat_result) -> None:
    euid = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != euid:
        raise UnsafeDirectory(f"{path} belongs to uid {st.st_uid}, not to cgd's uid {euid}")
    if mode & _WRITABLE:
        whom = "others" if mode & stat.S_IWOTH else "its group"
        raise UnsafeDirectory(f"{path} is writable by {whom} (mode {mode:04o})")
