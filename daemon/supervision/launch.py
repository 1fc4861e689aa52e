"""The first program of every worker: `python -I -S .../launch.pyc SPEC_FILE` (see `shim_argv`).

circus starts this shim; the shim opens the worker's log files, becomes the
worker's user, forks the worker's command and stays as its parent, to
write how the worker ended into a status file (`read_status`) and exit the
same way. A worker's exit status is known only to its parent: after a
kill -9 of cgd, the next cgd adopts the workers but is nobody's parent, and
without the shim it could not tell a job that exited 0 from one that
failed. The shim:

- joins the worker's cgroup first, when cgd tracks workers by cgroup (see
  cgroups.py): the worker and everything it forks are born in it;
- puts the worker in a process group of its own, which cgd signals to stop
  the worker and everything it spawned; the shim is not in it, so it never
  receives that signal and cannot pass it on a second time;
- passes every other signal it receives on to the worker alone (a
  promotion signal, a `kill` of the shim's pid), the way it was sent;
- stays tiny: it waits in `sigwaitinfo`, doing nothing until a signal or
  the worker's end; it writes the status with one write into a file it
  opened while still privileged (cgd's private directory), then exits
  with the worker's status or dies of the worker's signal.

Without a status file in the spec it execs the command in place instead.

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

Its start-up is part of every worker's start, so it costs what a bare
interpreter costs and little more:

- this file is run as a script with `-I -S`: no site-packages (nor the
  script's folder) on sys.path, so nothing but the standard library can be
  imported, and nothing of the installation's .pth files runs as root;
- cgd compiles it once, at start, into its private directory
  (`compile_shim`), so no start pays for compiling it (a millisecond);
- it imports only modules that are built in or cost well under a
  millisecond: `signal` and `json` would each load `enum` (and `json` also
  `re`), more time than everything else the shim does. Hence `_signal`,
  which `signal` only wraps in enums, and a spec of NUL-separated strings
  (argv and environment as the kernel takes them), which needs no parser.

cgd imports this module too (it writes the spec), so the format has one
definition.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # typeshed types only `signal`
import os
import pwd
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import NoReturn

LOG_MODE = 0o640
SPEC_MODE = 0o600
SPEC_SUFFIX = ".spec"
EXIT_CANNOT_RUN = 126
EXIT_NOT_FOUND = 127
STATUS_MODE = 0o600
_FORMAT = "cg-launch-4"
"""The first field of every spec: a shim never execs a file it does not understand."""
_ENCODING = ("utf-8", "surrogateescape")
"""As `os.fsencode` on Linux: any bytes of a path or argument go through unchanged."""


class LaunchSpec:
    """What the shim needs: the command, its complete environment, its user,
    its log files, where to write how it ended, the worker's cgroup and the
    CPUs to bind it to. Encoded as `cg-launch-4`, uid, gid, stdout, stderr,
    cwd (empty for none), status file (empty for none), cgroup directory
    (empty for none), CPUs (comma-separated, empty for no binding), the number of
    arguments, the arguments, then one `KEY=VALUE` per variable, separated by
    NUL (no field can hold one: the kernel takes every one of them as a C
    string)."""

    __slots__ = ("argv", "cgroup", "cpus", "cwd", "env", "gid", "status", "stderr", "stdout", "uid")

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], uid: int, gid: int,
                 stdout: str, stderr: str, cwd: str | None = None, status: str | None = None,
                 cgroup: str | None = None, cpus: Sequence[int] = ()) -> None:
        self.argv = tuple(argv)
        self.env = dict(env)
        self.uid = uid
        self.gid = gid
        self.stdout = stdout
        self.stderr = stderr
        self.cwd = cwd
        self.status = status
        self.cgroup = cgroup
        self.cpus = tuple(cpus)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LaunchSpec) and self._fields() == other._fields()

    def __repr__(self) -> str:
        return f"LaunchSpec{self._fields()!r}"

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def encode(self) -> bytes:
        if not self.argv:
            raise ValueError("argv must not be empty")
        for key in self.env:
            if not key or "=" in key:
                raise ValueError(f"environment variable name {key!r} is empty or holds '='")
        fields = [_FORMAT, str(self.uid), str(self.gid), self.stdout, self.stderr, self.cwd or "",
                  self.status or "", self.cgroup or "", ",".join(map(str, self.cpus)), str(len(self.argv)),
                  *self.argv,
                  *(f"{k}={v}" for k, v in self.env.items())]
        if any("\0" in f for f in fields):
            raise ValueError("no argument, variable or path may hold a NUL byte")
        return "\0".join(fields).encode(*_ENCODING)

    @classmethod
    def decode(cls, data: bytes) -> LaunchSpec:
        fields = data.decode(*_ENCODING).split("\0")
        if len(fields) < 11 or fields[0] != _FORMAT:
            raise ValueError(f"not a {_FORMAT} spec")
        count = int(fields[9])
        argv, variables = fields[10:10 + count], fields[10 + count:]
        if count < 1 or len(argv) != count:
            raise ValueError("argv must be a non-empty list of strings")
        env = {}
        for item in variables:
            key, sep, value = item.partition("=")
            if not key or not sep:
                raise ValueError(f"environment entry {item!r} is not KEY=VALUE")
            env[key] = value
        return cls(argv=argv, env=env, uid=int(fields[1]), gid=int(fields[2]),
                   stdout=fields[3], stderr=fields[4], cwd=fields[5] or None, status=fields[6] or None,
                   cgroup=fields[7] or None, cpus=tuple(int(c) for c in fields[8].split(",") if c))


def compile_shim(directory: str) -> str:
    """This file compiled into `directory` (cgd's private directory, where
    no other user may write what root then runs): the program `shim_argv`
    names. Compiled from the source cgd itself loaded, so the shim always
    matches the cgd that writes its specs."""
    import py_compile  # cgd's side only: the shim itself never pays for it

    compiled = os.path.join(directory, "launch.pyc")
    py_compile.compile(os.path.abspath(__file__), cfile=compiled, doraise=True)
    return compiled


def shim_argv(shim: str, spec_path: str) -> list[str]:
    """The command circus runs: the compiled shim (`compile_shim`) as a
    script. `-I` keeps PYTHON* variables, the user site directory and the
    script's folder out of the root part of the launch; `-S` keeps
    site-packages out, and with them the cost of importing `site`."""
    return [sys.executable, "-I", "-S", shim, spec_path]


def write_spec(path: str, spec: LaunchSpec) -> None:
    """Atomically, readable only by cgd's user: the env may hold secrets."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, SPEC_MODE)
    with os.fdopen(fd, "wb") as fh:
        fh.write(spec.encode())
    os.replace(tmp, path)


class ShimStatus:
    """What a status file says: the shim's pid, its worker's, and once the worker has ended its
    exit code (negative: the signal that ended it)."""

    __slots__ = ("code", "shim", "worker")

    def __init__(self, shim: int, worker: int, code: int | None) -> None:
        self.shim = shim
        self.worker = worker
        self.code = code

    def __repr__(self) -> str:
        return f"ShimStatus(shim={self.shim}, worker={self.worker}, code={self.code})"


def read_status(path: str) -> ShimStatus | None:
    """The status file the shim writes (`SHIM WORKER` once it forked the worker, `SHIM WORKER CODE`
    once the worker ended); None when there is none, or not a whole line of one."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(128)
    except OSError:
        return None
    fields = data.split()
    if not data.endswith(b"\n") or len(fields) not in (2, 3):
        return None
    try:
        numbers = [int(f) for f in fields]
    except ValueError:
        return None
    return ShimStatus(numbers[0], numbers[1], numbers[2] if len(numbers) == 3 else None)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        _die("usage: python -I -S launch.pyc SPEC_FILE", 2)
    try:
        with open(args[0], "rb") as fh:
            spec = LaunchSpec.decode(fh.read())
    except (OSError, ValueError) as exc:
        _die(f"cannot read launch spec {args[0]}: {exc}", EXIT_CANNOT_RUN)
    if spec.cgroup:
        _join_cgroup(spec.cgroup)
    _redirect_output(spec)
    if spec.cpus:
        _bind_cpus(spec.cpus)
    status = _open_status(spec.status) if spec.status else -1
    try:
        become(spec.uid, spec.gid)
        os.chdir(spec.cwd or spec.env.get("HOME") or "/")
    except OSError as exc:
        _die(f"cannot switch to uid {spec.uid}, gid {spec.gid}, cwd {spec.cwd!r}: {exc}", EXIT_CANNOT_RUN)
    _reset_signals()
    _close_other_descriptors(status)
    if status < 0:
        _exec(spec)
    _signal.pthread_sigmask(_signal.SIG_BLOCK, _WAITED)  # from before the fork: no signal is missed
    worker = os.fork()
    if worker == 0:
        os.setpgid(0, 0)
        _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
        _exec(spec)
    try:
        os.setpgid(worker, worker)  # the child does it too: whichever runs first, the group exists now
    except OSError:
        pass  # the child has exec'd already, and so has its group
    os.write(status, f"{os.getpid()} {worker}\n".encode())
    code = _wait_passing_signals(worker)
    os.pwrite(status, f"{os.getpid()} {worker} {code}\n".encode(), 0)
    _exit_like(code)


def _bind_cpus(cpus: Sequence[int]) -> None:
    """Bind the shim, and so the worker it forks, to its GPUs' NUMA-local CPUs. A binding the
    kernel refuses (a cpuset that excludes them) is said in the worker's log, not fatal."""
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:
        os.write(2, f"cgd launch: CPU binding not applied: {exc}\n".encode())


def _exec(spec: LaunchSpec) -> NoReturn:
    try:
        os.execvpe(spec.argv[0], list(spec.argv), spec.env)
    except FileNotFoundError:
        _die(f"cannot run {spec.argv[0]!r}: not found (PATH={spec.env.get('PATH', '')})", EXIT_NOT_FOUND)
    except OSError as exc:
        _die(f"cannot run {spec.argv[0]!r}: {exc}", EXIT_CANNOT_RUN)


_SYNCHRONOUS = {_signal.SIGSEGV, _signal.SIGBUS, _signal.SIGILL, _signal.SIGFPE, _signal.SIGTRAP, _signal.SIGSYS}
"""Raised by the shim's own faults, never sent: left unblocked, so such a fault ends the shim."""
_PASSED_ON = _signal.valid_signals() - {_signal.SIGKILL, _signal.SIGSTOP, _signal.SIGCHLD} - _SYNCHRONOUS
_WAITED = _PASSED_ON | {_signal.SIGCHLD}
_DUMPS_CORE = {_signal.SIGQUIT, _signal.SIGABRT, _signal.SIGXCPU, _signal.SIGXFSZ} | _SYNCHRONOUS
"""Signals whose default action dumps core: the shim exits 128+N rather than leave a core of itself."""


def _wait_passing_signals(worker: int) -> int:
    """Pass each signal the shim receives on to the worker until it ends; its exit code
    (negative: the signal that ended it)."""
    while True:
        info = _signal.sigwaitinfo(_WAITED)
        if info.si_signo != _signal.SIGCHLD:
            try:
                os.kill(worker, info.si_signo)
            except ProcessLookupError:
                pass  # it ended: the SIGCHLD is pending
            continue
        pid, wait_status = os.waitpid(worker, os.WNOHANG)
        if pid == worker:
            return os.waitstatus_to_exitcode(wait_status)


def _exit_like(code: int) -> NoReturn:
    """End the way the worker ended, so cgd, when it is the shim's parent, reads the same status."""
    if code >= 0 or -code in _DUMPS_CORE:
        os._exit(code if code >= 0 else 128 - code)
    _signal.signal(-code, _signal.SIG_DFL)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {-code})
    os.kill(os.getpid(), -code)
    os._exit(128 - code)  # a signal whose default is to be ignored: say it as a shell would


def _join_cgroup(directory: str) -> None:
    """Move the shim into the worker's cgroup before anything else, still privileged: the worker
    and all it forks are born in it, and cgd finds and kills them there whatever they do with
    their environment or process group. One write; `0` names the writer itself."""
    try:
        fd = os.open(f"{directory}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)
    except OSError as exc:
        _die(f"cannot join the worker's cgroup {directory}: {exc}", EXIT_CANNOT_RUN)


def _open_status(path: str) -> int:
    """Opened while still privileged, in cgd's private directory the worker's user cannot enter;
    emptied, so nothing of an earlier run can be read as this one's."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, STATUS_MODE)
    except OSError as exc:
        _die(f"cannot open the status file {path}: {exc}", EXIT_CANNOT_RUN)


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
    for sig in (_signal.SIGPIPE, _signal.SIGXFSZ):
        _signal.signal(sig, _signal.SIG_DFL)
    _signal.pthread_sigmask(_signal.SIG_SETMASK, ())


def _close_other_descriptors(keep: int) -> None:
    """The worker gets 0, 1 and 2 only (the shim keeps `keep`, its status file,
    which closes on exec). Listed rather than closed by range: RLIMIT_NOFILE
    can be a billion in containers, and closerange falls back to one close()
    per number on kernels without close_range."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2 and int(name) != keep:
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
