"""Where each worker's stdout and stderr go, their rotation, and reading them back.

Workers write their log files themselves (see daemon/launch.py), so a worker
keeps logging while cgd is down or restarting. That rules out rotating by
renaming (the worker would go on writing to the renamed file): cgd rotates by
copy-then-truncate, which is safe because every worker opens its files with
O_APPEND, so after the truncation its next write lands at offset 0. Bytes
written between the copy and the truncation are lost; that window is a few
milliseconds per rotation.

cgd may run as root while the files belong to users, so every open here uses
O_NOFOLLOW, and component directories belong to cgd: a user can write their
files but can not put a symlink where cgd will write.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

_COMPONENT = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
FILE_MODE = 0o640
DIR_MODE = 0o755
_BLOCK = 64 * 1024
MAX_READ = 1024 * 1024


class LogPaths(NamedTuple):
    stdout: Path
    stderr: Path


@dataclass(frozen=True)
class LogChunk:
    """Part of a log file. `offset` is where the next read should start
    (the end of `data` in the file); a follower passes it back."""

    path: str
    offset: int
    size: int
    data: str


def log_paths(log_dir: str | os.PathLike[str], component: str, replica: int) -> LogPaths:
    """`<log_dir>/<component>/<replica>.out|.err`, one pair per replica
    whatever its role, so a promoted shadow's output stays in one place.

    The name is checked here again, although the manager validated it: this
    function makes paths cgd writes to as root.
    """
    if not _COMPONENT.fullmatch(component):
        raise ValueError(f"{component!r} is not a valid component name")
    if replica < 0:
        raise ValueError(f"replica must be >= 0, got {replica}")
    base = Path(log_dir) / component / str(replica)
    return LogPaths(base.with_suffix(".out"), base.with_suffix(".err"))


def prepare_log_file(path: str | os.PathLike[str], uid: int, gid: int) -> None:
    """Create the log file (and its directory) owned by the worker's user.

    A file left by an earlier component of the same name that belonged to
    someone else is removed with its backups: the new owner must not read
    the previous owner's output.
    """
    path = Path(path)
    path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and (not stat.S_ISREG(st.st_mode) or st.st_uid != uid):
        for victim in [path, *_backups(path)]:
            try:
                os.unlink(victim)
            except FileNotFoundError:
                pass
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        _own(fd, uid, gid)
    finally:
        os.close(fd)


def rotate(path: str | os.PathLike[str], max_bytes: int, backups: int) -> bool:
    """Copy-truncate `path` once it is larger than `max_bytes`, keeping
    `backups` older copies as `.1` (newest) to `.N`. True if it rotated.

    Blocking file I/O: call it from a thread (asyncio.to_thread), never on
    the event loop, where a large copy would delay exit notifications.
    """
    path = Path(path)
    try:
        src = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode) or st.st_size <= max_bytes:
            return False
        if backups <= 0:
            os.ftruncate(src, 0)
            return True
        for n in range(backups - 1, 0, -1):
            older = path.with_name(f"{path.name}.{n}")
            if older.exists():
                os.replace(older, path.with_name(f"{path.name}.{n + 1}"))
        first = path.with_name(f"{path.name}.1")
        tmp = path.with_name(f".{path.name}.1.tmp")
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        try:
            _own(dst, st.st_uid, st.st_gid)
            while os.sendfile(dst, src, None, 16 * 1024 * 1024):
                pass
        finally:
            os.close(dst)
        os.ftruncate(src, 0)
        os.replace(tmp, first)
        return True
    finally:
        os.close(src)


def rotate_all(log_dir: str | os.PathLike[str], max_bytes: int, backups: int) -> list[Path]:
    """Rotate every worker log under `log_dir`; the files it rotated.

    Blocking, like `rotate`.
    """
    rotated: list[Path] = []
    try:
        components = sorted((e for e in os.scandir(log_dir) if e.is_dir(follow_symlinks=False)),
                            key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return rotated
    for component in components:
        # It runs every second over every worker's logs: one stat per file from the directory
        # scan, and a file is opened only once it is past the limit.
        for entry in sorted(os.scandir(component.path), key=lambda e: e.name):
            if (entry.name.endswith((".out", ".err")) and entry.is_file(follow_symlinks=False)
                    and entry.stat(follow_symlinks=False).st_size > max_bytes
                    and rotate(entry.path, max_bytes, backups)):
                rotated.append(Path(entry.path))
    return rotated


def read_log(path: str | os.PathLike[str], tail: int | None = None,
             offset: int | None = None) -> dict[str, Any]:
    """The answer of `GET /v1/components/{name}/logs`: from `offset` when
    following, else the last `tail` lines, else the end of the file (at most
    MAX_READ bytes). A log not written yet reads as empty."""
    try:
        if offset is not None:
            chunk = read_from(path, offset)
        else:
            chunk = read_tail(path, tail)
    except FileNotFoundError:
        chunk = LogChunk(str(path), 0, 0, "")
    return asdict(chunk)


def read_tail(path: str | os.PathLike[str], lines: int | None, max_bytes: int = MAX_READ) -> LogChunk:
    """The last `lines` lines, or everything when None, within `max_bytes`."""
    with _open_read(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        start = size
        data = b""
        while start > 0 and size - start < max_bytes and (lines is None or data.count(b"\n") <= lines):
            step = min(_BLOCK, start, max_bytes - (size - start))
            start -= step
            fh.seek(start)
            data = fh.read(step) + data
    if lines is not None and lines <= 0:
        return LogChunk(str(path), size, size, "")
    skip = 0
    if lines is not None:
        body = data[:-1] if data.endswith(b"\n") else data
        cut = len(body)
        for _ in range(lines):
            cut = body.rfind(b"\n", 0, cut)
            if cut < 0:
                break
        skip = cut + 1 if cut >= 0 else 0
    while skip < len(data) and start + skip > 0 and data[skip] & 0xC0 == 0x80:
        skip += 1
    text, used = _whole_characters(data[skip:])
    return LogChunk(str(path), start + skip + used, size, text)


def read_from(path: str | os.PathLike[str], offset: int, max_bytes: int = MAX_READ) -> LogChunk:
    """What was written since `offset`, for `cgctl logs --follow`.

    An offset beyond the end means the file was rotated meanwhile: reading
    starts again at 0.
    """
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    with _open_read(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        if offset > size:
            offset = 0
        fh.seek(offset)
        data = fh.read(max_bytes)
    text, used = _whole_characters(data)
    return LogChunk(str(path), offset + used, size, text)


def _open_read(path: str | os.PathLike[str]) -> BinaryIO:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    return os.fdopen(fd, "rb")


def _whole_characters(data: bytes) -> tuple[str, int]:
    """Decode, leaving out a UTF-8 sequence cut at the end of the chunk so a
    follower reads it whole next time; the text and the bytes it used."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue
        if byte & 0x80:
            needed = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
            if back < needed:
                data = data[:-back]
        break
    return data.decode("utf-8", errors="replace"), len(data)


def _own(fd: int, uid: int, gid: int) -> None:
    st = os.fstat(fd)
    if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (uid, gid):
        os.fchown(fd, uid, gid)
    if stat.S_IMODE(st.st_mode) != FILE_MODE:
        os.fchmod(fd, FILE_MODE)


def _backups(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.*"))


def read_worker_log(log_dir: str | os.PathLike[str], component: str, replica: int, stream: str,
                    owner_uid: int, tail: int | None = None, offset: int | None = None) -> dict[str, Any]:
    """A replica's `stdout` or `stderr` log as `read_log` answers, for the component's owner.

    A file owned by anyone else was left by an earlier component of the same
    name and another owner: it reads as empty, never as this one's output.
    """
    out, err = log_paths(log_dir, component, replica)
    path = out if stream == "stdout" else err
    try:
        if os.stat(path).st_uid != owner_uid:
            return {"path": str(path), "offset": 0, "size": 0, "data": ""}
    except FileNotFoundError:
        pass
    return read_log(path, tail=tail, offset=offset)
