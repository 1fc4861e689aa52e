"""Checks made on a user's behalf, as that user.

A root cgd that checked a worker's `cwd` or command as root would answer
201 where the user's own start then fails (a directory only root can
enter), and its 400 would tell one user about another's private paths. So
the check runs in a short-lived child with the user's ids and groups,
exactly as the launch shim will be when it execs the command; a cgd that is
not root checks in place, as itself.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from computegroups.daemon.supervision.launch import become


def start_problem(uid: int, gid: int, argv: Sequence[str], path: str, cwd: str) -> str | None:
    """Why `argv` could not start for `uid` in `cwd` (no such directory, program not found or not
    executable); None if it can. An empty `argv` checks the directory alone."""
    if os.geteuid() != 0 or uid == 0:
        return _problem(argv, path, cwd)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child, which only reports through the pipe
        code = 1
        try:
            os.close(read_end)
            become(uid, gid)
            os.write(write_end, (_problem(argv, path, cwd) or "").encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    chunks = []
    with os.fdopen(read_end, "rb") as pipe:
        while chunk := pipe.read(4096):
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return f"could not check the command as uid {uid}"
    return b"".join(chunks).decode() or None


def _problem(argv: Sequence[str], path: str, cwd: str) -> str | None:
    if not os.path.isdir(cwd):
        return f"cwd: {cwd} is not a directory"
    if not os.access(cwd, os.X_OK):
        return f"cwd: {cwd}: permission denied"
    if not argv:
        return None
    program = argv[0]
    if "/" in program:
        candidates = [os.path.join(cwd, program)]  # an absolute program stays itself
    else:
        candidates = [os.path.join(d or ".", program) for d in path.split(":")]
    found = [c for c in candidates if os.path.isfile(c)]
    if not found:
        where = program if "/" in program else f"{program!r} on the worker's PATH ({path})"
        return f"command[0]: {where}: not found"
    if not any(os.access(c, os.X_OK) for c in found):
        return f"command[0]: {found[0]} is not executable"
    return None
