"""The first program of every worker: `python -I -m computegroups.daemon.supervision.launch --spec FILE`.

circus starts this shim; the shim opens the worker's log files, becomes the
worker's user, and then execs the worker's command in place, so the pid
circus tracks IS the worker and signals reach it directly.

Why a shim rather than circus's own options:

- circus would pipe stdout/stderr through cgd; a worker must keep logging
  (and not die of SIGPIPE) while cgd is down, so it writes its own files;
- circus switches uid in its preexec_fn, before exec, so the interpreter
  running this shim and the log files would have to be reachable by every
  user; here the files are opened as root in cgd's directory first, then
  privileges are dropped for good before the user's command runs;
- the spec comes from a file (0600, in cgd's private runtime directory)
  rather than the command line or the environment: argv on a command line is
  rewritten by circus (`$(circus.*)`), a command line is world-readable, and
  the worker's environment must not reach this root process (LD_PRELOAD).
  circus starts the shim with an empty environment; the worker gets exactly
  the environment in the spec.

Only the standard library is used: the shim runs before anything is known
to be importable as the worker's user.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

LOG_MODE = 0o640
SPEC_MODE = 0o600
EXIT_CANNOT_RUN = 126
EXIT_NOT_FOUND = 127


@dataclass(frozen=True)
class LaunchSpec:
    argv: tuple[str, ...]
    env: Mapping[str, str]
    uid: int
    gid: int
    stdout: str
    stderr: str
    cwd: str | None = None

    def to_json(self) -> str:
        return json.dumps({
            "argv": list(self.argv), "env": dict(self.env), "uid": self.uid, "gid": self.gid,
            "stdout": self.stdout, "stderr": self.stderr, "cwd": self.cwd,
        })

    @classmethod
    def from_json(cls, text: str) -> LaunchSpec:
        data = json.loads(text)
        argv = data["argv"]
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv must be a non-empty list of strings")
        env = data["env"]
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise ValueError("env must map strings to strings")
        return cls(
            argv=tuple(argv), env=env, uid=int(data["uid"]), gid=int(data["gid"]),
            stdout=str(data["stdout"]), stderr=str(data["stderr"]),
            cwd=data.get("cwd"),
        )


def shim_argv(spec_path: str) -> list[str]:
    """The command circus runs. `-I` keeps PYTHON* variables and the user
    site directory out of the root part of the launch."""
    return [sys.executable, "-I", "-m", "computegroups.daemon.supervision.launch", "--spec", spec_path]


def write_spec(path: str, spec: LaunchSpec) -> None:
    """Atomically, readable only by cgd's user: the env may hold secrets."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, SPEC_MODE)
    with os.fdopen(fd, "w") as fh:
        fh.write(spec.to_json())
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "--spec":
        _die("usage: python -I -m computegroups.daemon.supervision.launch --spec FILE", 2)
    try:
        with open(args[1], encoding="utf-8") as fh:
            spec = LaunchSpec.from_json(fh.read())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _die(f"cannot read launch spec {args[1]}: {exc}", EXIT_CANNOT_RUN)
    _redirect_output(spec)
    try:
        become(spec.uid, spec.gid)
        os.chdir(spec.cwd or spec.env.get("HOME") or "/")
    except OSError as exc:
        _die(f"cannot switch to uid {spec.uid}, gid {spec.gid}, cwd {spec.cwd!r}: {exc}", EXIT_CANNOT_RUN)
    _reset_signals()
    _close_other_descriptors()
    try:
        os.execvpe(spec.argv[0], list(spec.argv), dict(spec.env))
    except FileNotFoundError:
        _die(f"cannot run {spec.argv[0]!r}: not found (PATH={spec.env.get('PATH', '')})", EXIT_NOT_FOUND)
    except OSError as exc:
        _die(f"cannot run {spec.argv[0]!r}: {exc}", EXIT_CANNOT_RUN)


def _redirect_output(spec: LaunchSpec) -> None:
    """Open the logs while still privileged (they live in cgd's directory)
    and hand them to the worker's user; errors go to cgd's own stderr."""
    try:
        out = _open_log(spec.stdout, spec.uid, spec.gid)
        err = out if spec.stderr == spec.stdout else _open_log(spec.stderr, spec.uid, spec.gid)
    except OSError as exc:
        _die(f"cannot open the log files of {spec.argv[0]!r}: {exc}", EXIT_CANNOT_RUN)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in {out, err}:
        if fd > 2:
            os.close(fd)


def _open_log(path: str, uid: int, gid: int) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, LOG_MODE)
    st = os.fstat(fd)
    if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (uid, gid):
        os.fchown(fd, uid, gid)
    return fd


def become(uid: int, gid: int) -> None:
    """Drop to the worker's user for good (real, effective and saved ids),
    with that user's supplementary groups. A non-root cgd can only run
    workers as itself."""
    if os.geteuid() != 0:
        if uid != os.geteuid():
            raise PermissionError(f"cgd runs as uid {os.geteuid()} and can not start uid {uid}")
        return
    if uid == 0:
        return
    try:
        groups = os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except KeyError:
        groups = [gid]
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def _reset_signals() -> None:
    """Python ignores SIGPIPE and SIGXFSZ, and ignored signals stay ignored
    across exec: give the worker the defaults a shell would."""
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def _close_other_descriptors() -> None:
    """The worker gets 0, 1 and 2 only. Listed rather than closed by range:
    RLIMIT_NOFILE can be a billion in containers, and closerange falls back
    to one close() per number on kernels without close_range."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            try:
                os.close(int(name))
            except OSError:
                pass


def _die(message: str, code: int) -> NoReturn:
    try:
        os.write(2, f"cgd launch: {message}\n".encode(errors="replace"))
    finally:
        os._exit(code)


if __name__ == "__main__":
    main()
