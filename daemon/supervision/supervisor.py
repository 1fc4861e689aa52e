"""Every worker process of cgd: start, stop, restart, adopt, and report.

One circus watcher per worker (one replica of a component, whatever its role),
because circus keeps one environment per watcher and each replica's
CUDA_VISIBLE_DEVICES differs. circus forks the process (see
daemon/supervision/arbiter.py for how its arbiter is run); this module
decides everything else:

- exits are seen through a pidfd on the event loop, within a millisecond,
  and reported through `on_exit` for EVERY exit, with `will_restart` saying
  whether the supervisor restarts it, so the manager can promote a shadow
  at once and keep state right;
- restarts follow the worker's `RestartPolicy` (exponential backoff, give up
  after `max_retries` consecutive quick failures); `on_start` reports every
  new pid and its start time, which the manager records;
- a worker found alive after cgd died is adopted: its launch shim watched
  through its pidfd, never restarted while it lives, started fresh under
  circus once it exits; its exit status is the one the shim wrote into the
  worker's status file (the shim is the worker's parent, cgd no longer is);
- the count of quick failures in a row is kept beside the status file, so a
  cgd started again (not a reboot) goes on counting towards `max_retries`;
- stopping signals the worker's whole process group and waits until none
  of it is left (a child that outlives the worker keeps its GPU memory),
  then SIGKILLs what is left after the stop timeout;
- a worker is all it started: its process group, what carries its marks, and
  where cgd can have one, its cgroup (see cgroups.py), which nothing leaves.
  What is left of it once its main process ended is stopped before it
  restarts or its stop returns, and its cgroup is removed once empty.

Workers are never tied to cgd's life (no PDEATHSIG): after `kill -9` of cgd
they keep running, and the next cgd adopts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import signal as signals
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from circus.process import Process
from circus.watcher import Watcher

from computegroups.daemon.model.enums import RestartMode
from computegroups.daemon.paths import own_dir
from computegroups.daemon.supervision import cgroups, worklogs
from computegroups.daemon.supervision.arbiter import LoopArbiter
from computegroups.daemon.supervision.cgroups import MARKS_ONLY, Tracking
from computegroups.daemon.supervision.launch import (
    SPEC_SUFFIX,
    LaunchSpec,
    compile_shim,
    read_status,
    shim_argv,
    write_spec,
)
from computegroups.daemon.supervision.processes import ProcessHandle, start_time
from computegroups.daemon.supervision.proctree import marked_processes
from computegroups.topology.ranges import format_ranges

log = logging.getLogger(__name__)

KEY_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
SHELL = ("/bin/sh", "-c")
KILL_WAIT_S = 5.0
"""How long to wait for a process group after SIGKILL; longer means one of
its processes is stuck in the kernel (uninterruptible sleep, often a wedged
GPU) and is left to it."""
FORK_WAIT_S = 5.0
"""How long a start waits for its shim to fork the worker: a loaded box may take a while to start
an interpreter, but a shim that never forks (it could not run the command) ends at once."""
GROUP_POLL_S = 0.05
"""How often a stopping worker's group is looked at once the worker itself
has exited: a stop lasts this much longer than the group at most."""

_DETACHED: list[Process] = []
"""Processes handed over to the next cgd (`stop(keep_workers=True)`). They are
our children: kept referenced so that subprocess's finalizer neither reaps
them nor warns that they still run."""

T = TypeVar("T")
STATUS_DIR = "workers"
"""Under the runtime directory, mode 0700: each worker's status file (`<key>.status`, written by its
launch shim) and its count of failures in a row (`<key>.failures`). Not in circus's directory, which
may be a temporary one that a restarted cgd would not find."""


@dataclass(frozen=True)
class RestartPolicy:
    """Restart on any exit cgd did not ask for, after `backoff_s`, doubling
    up to `backoff_max_s` for each consecutive quick failure; give up after
    `max_retries` of them. A run that lasted `reset_after_s` is not a quick
    failure: the count starts again."""

    mode: RestartMode = RestartMode.ALWAYS
    max_retries: int = 5
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    reset_after_s: float = 60.0

    def delay(self, failures: int) -> float:
        return float(min(self.backoff_s * 2 ** max(0, failures - 1), self.backoff_max_s))

    def wants_restart(self, returncode: int | None) -> bool:
        """Whether an exit with `returncode` calls for another run.

        None (unknown) happens only when the launch shim itself was killed
        (or for a worker of a cgd from before the shim wrote statuses): a
        kill, so a failure for `on-failure`."""
        if self.mode == RestartMode.ALWAYS:
            return True
        return self.mode == RestartMode.ON_FAILURE and returncode != 0


@dataclass(frozen=True)
class WorkerSpec:
    """One worker process, exec'd exactly as `argv` (searched in env's PATH
    as the worker's user). `env` is complete (see daemon/workerenv.py):
    nothing of cgd's environment is added. `shell` marks a request that
    asked for a shell: argv is then `/bin/sh -c COMMAND ...`."""

    key: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None
    uid: int
    gid: int
    stdout_path: str
    stderr_path: str
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    stop_timeout_s: float = 10.0
    stop_signal: int = signals.SIGTERM
    shell: bool = False
    cpus: tuple[int, ...] = ()
    """The CPUs the worker is bound to (its GPUs' NUMA-local ones); () for none."""


def describe_exit(returncode: int | None, *, adopted: bool = False) -> str:
    """`status N`, `signal NAME`, or why the status is unknown.

    An adopted worker's status comes from its launch shim's status file; it
    is unknown when the shim was killed itself. A restart that could not
    fork has none.

    >>> describe_exit(3), describe_exit(-9), describe_exit(None, adopted=True)
    ('status 3', 'signal SIGKILL', 'an unknown status (its launch shim was killed)')
    """
    if returncode is None:
        return ("an unknown status (its launch shim was killed)" if adopted
                else "no status (it could not be started)")
    if returncode < 0:
        try:
            return f"signal {signals.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"status {returncode}"


@dataclass(frozen=True)
class WorkerExit:
    """`returncode` is negative when a signal killed it, None when unknown
    (its launch shim was killed) or when pid is 0: a restart that could not
    even fork. `pid` is the launch shim's, the process cgd watches; `worker`
    the worker's own (what its user saw), None when the shim never forked it."""

    key: str
    pid: int
    returncode: int | None
    will_restart: bool
    worker: int | None = None

    @property
    def status(self) -> str:
        """How it ended, in words for a log: `status 3`, `signal SIGKILL`, or why it is not known."""
        return describe_exit(self.returncode, adopted=self.pid != 0)


@dataclass(frozen=True)
class WorkerStart:
    """`pid` and `create_time` are the launch shim's (the process cgd watches and adopts);
    `worker` is the worker's own pid, None when the shim ended before forking it."""

    key: str
    pid: int
    create_time: float
    worker: int | None = None


class SpawnError(RuntimeError):
    """circus could not fork the worker (out of processes or memory)."""


@dataclass(eq=False)
class _Run:
    handle: ProcessHandle
    process: Process | None
    exited: asyncio.Future[int | None]
    shim: bool = True
    """The process is a launch shim that writes the worker's status (every run but one adopted from
    a cgd of before)."""


@dataclass(eq=False)
class _Worker:
    spec: WorkerSpec
    spec_file: Path
    watcher: Watcher | None = None
    run: _Run | None = None
    failures: int = 0
    wanted: bool = True
    restart: asyncio.TimerHandle | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Supervisor:
    """Owns every worker process. Runs on the event loop that calls
    `start()`; all methods must be called from that loop."""

    def __init__(self, runtime_dir: Path, on_exit: Callable[[WorkerExit], None],
                 on_start: Callable[[WorkerStart], None] | None = None, tracking: Tracking = MARKS_ONLY) -> None:
        self._runtime_dir = Path(runtime_dir)
        self.tracking = tracking
        """How a worker's processes are found: its cgroup, or only its marks (see cgroups.py)."""
        self._status_dir = self._runtime_dir / STATUS_DIR
        self._on_exit = on_exit
        self._on_start = on_start
        self._workers: dict[str, _Worker] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._cleanups: dict[str, asyncio.Task[None]] = {}
        """Per worker key: stopping what its last run left running (see `_end_leftovers`)."""
        self._unbound: set[tuple[int, ...]] = set()
        """CPU bindings already logged as not applied (their CPUs are not on this host)."""
        self._arbiter: LoopArbiter | None = None
        self._shim = ""
        """The compiled launch shim, in the arbiter's private directory (see launch.py)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._arbiter = LoopArbiter(self._runtime_dir)  # makes the runtime directory if need be
        own_dir(self._status_dir, 0o700)
        self._shim = compile_shim(str(self._arbiter.directory))
        await self._arbiter.start()

    async def stop(self, keep_workers: bool = False) -> None:
        """Stop every worker gracefully (each within its own stop timeout,
        all at once), or with `keep_workers` leave them running for the next
        cgd to adopt."""
        self._closing = True
        for worker in self._workers.values():
            worker.wanted = False
            if worker.restart is not None:
                worker.restart.cancel()
        if keep_workers:
            for worker in self._workers.values():
                if worker.run is not None:
                    worker.run.handle.close()
                    if worker.run.process is not None:
                        _DETACHED.append(worker.run.process)
            self._workers.clear()
        else:
            await asyncio.gather(*(self.stop_worker(key) for key in list(self._workers)))
            await asyncio.gather(*(self._cleaned(key) for key in list(self._cleanups)))
            await self.end_unowned()
            cgroups.remove(self.tracking.path)
        for task in list(self._tasks):
            task.cancel()
        if self._arbiter is not None:
            self._arbiter.close()
            self._arbiter = None

    async def start_worker(self, spec: WorkerSpec, resume: bool = False) -> WorkerStart:
        """Start `spec` under circus; returns once the process exists (it
        may still be loading). The key must not be supervised already.
        `resume`: a worker of an earlier cgd that died meanwhile, whose
        failures in a row still count; else it starts with none."""
        worker = self._new_worker(spec)
        worker.failures = self._failures_kept(spec.key) if resume else 0
        self._keep_failures(worker)
        for path in {spec.stdout_path, spec.stderr_path}:
            worklogs.prepare_log_file(path, spec.uid, spec.gid)
        self._workers[spec.key] = worker
        await self._cleaned(spec.key)  # what an earlier worker of this key left, before the new one runs
        async with worker.lock:
            try:
                return await self._spawn(worker)
            except BaseException:
                self._forget(worker)
                raise

    async def stop_worker(self, key: str, timeout: float | None = None, *, hold_if_stuck: bool = False) -> None:
        """Stop signal to the worker's process group, SIGKILL to what is left
        of the group after `timeout` (default: its stop_timeout_s); returns
        when the whole group is gone and the worker forgotten. A pending
        restart is cancelled. Unknown keys are ignored, so stopping twice is
        harmless.

        A process stuck in the kernel (a hung driver call) outlives SIGKILL.
        After KILL_WAIT_S more, with `hold_if_stuck` (a release: its devices
        must not go to anyone else while the process may still use them) the
        worker stays known and WorkerStuck names the pids, so a later stop
        tries again; without it (a restart of the same replica, cgd's own
        stop) the pids are logged and left to the kernel."""
        worker = self._workers.get(key)
        if worker is None:
            return
        worker.wanted = False
        if worker.restart is not None:
            worker.restart.cancel()
            worker.restart = None
        await self._cleaned(key)
        async with worker.lock:
            run = worker.run
            if run is not None:
                grace = worker.spec.stop_timeout_s if timeout is None else timeout
                left = await _terminate(run.handle, run.exited, worker.spec.stop_signal, grace)
                # what left its process group
                left |= await _end_leftovers(worker.spec, run.handle, self._cgroup(key), group=False)
                if left and hold_if_stuck:
                    raise WorkerStuck(key, left)
            self._forget(worker)
            self._remove_cgroup(key)

    def adopt(self, spec: WorkerSpec, pid: int, create_time: float) -> bool:
        """Watch a worker a previous cgd started, without restarting it.
        False if `pid` is gone or is another process (its start time differs
        from `create_time`: the pid was reused). `on_start` is not called:
        the pid is the one already recorded. Once it exits, `on_exit` is
        called and it is started fresh per its restart policy."""
        worker = self._new_worker(spec)
        status = read_status(self._status_file(spec.key))
        shim = status is not None and status.shim == pid
        handle = ProcessHandle.open(pid, create_time, find_group=self._worker_finder(spec.key, pid) if shim else None)
        if handle is None:
            return False
        worker.failures = self._failures_kept(spec.key)
        worker.run = self._watch(worker, handle, None, shim=shim)
        self._workers[spec.key] = worker
        return True

    async def stop_stray(self, pid: int, create_time: float, timeout: float = 10.0, key: str | None = None) -> bool:
        """Stop a process of a previous run that state says should not run,
        with its group, as `stop_worker` does (SIGTERM, SIGKILL after
        `timeout`). False if it was already gone or the pid now belongs to
        another process. With the worker's `key`, a launch shim's worker
        group is found from its status file."""
        status = read_status(self._status_file(key)) if key is not None else None
        finder = self._worker_finder(key, pid) if key is not None and status is not None and status.shim == pid \
            else None
        handle = ProcessHandle.open(pid, create_time, find_group=finder)
        if handle is None:
            return False
        exited: asyncio.Future[int | None] = self._running_loop().create_future()
        handle.watch(self._running_loop(), lambda: _resolve(exited, handle.reap()))
        try:
            await _terminate(handle, exited, signals.SIGTERM, timeout)
            if key is not None and not self.supervises(key):
                await _end_rest(key, self._cgroup(key), set(), signals.SIGTERM, timeout)
                self._remove_cgroup(key)
        finally:
            handle.close()
        return True

    async def end_marked(self, marks: Mapping[str, str], uid: int, label: str, timeout: float) -> set[int]:
        """Stop every process of `uid` carrying `marks` (SIGTERM, SIGKILL after `timeout`). For what a
        `cgctl run` command left when its lease ends: cgctl's child is no worker of cgd, so no cgroup
        or process group of cgd's holds it, but it and all it starts carry the marks of the
        environment cgd gave it (`GET .../env`). Returns those that outlived SIGKILL."""
        def owned() -> set[int]:
            found = set()
            for pid, _, _ in marked_processes(marks):
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{pid}").st_uid == uid:
                        found.add(pid)
            return found

        pids = await asyncio.to_thread(owned)
        return await _end_rest(label, None, pids, signals.SIGTERM, timeout)

    async def end_unowned(self, keep: Collection[str] = ()) -> None:
        """Kill what runs in worker cgroups no supervised worker owns (left by a worker that ended
        while no cgd watched it), and remove them. Run once the workers of the state are adopted or
        started (and at a stop, for what is left). `keep`: the keys of workers a lost generation of
        the state started, kept running until someone has looked (recovery's state loss)."""
        for directory in cgroups.worker_dirs(self.tracking):
            if directory.name in self._workers or directory.name in keep:
                continue
            await _end_rest(directory.name, directory, set(), signals.SIGKILL, 0.0)
            self._remove_cgroup(directory.name)

    def memory(self, key: str) -> int | None:
        """Bytes worker `key` and all it started use now, from its cgroup; None where that is not
        known (tracked by marks, or no memory controller for its cgroup)."""
        return cgroups.memory(self._cgroup(key)) if key in self._workers else None

    def exit_status(self, key: str, pid: int) -> int | None:
        """How the worker whose launch shim was `pid` ended, as the shim wrote it: for a worker that
        ended while no cgd watched it. None while it runs, or when nothing was written."""
        status = read_status(self._status_file(key))
        return status.code if status is not None and status.shim == pid else None

    def signal(self, key: str, signum: int) -> bool:
        """Send `signum` to the worker's main process only (not its group:
        a promotion signal must not kill children that ignore it). False if
        it is not running; KeyError for an unknown key."""
        run = self._workers[key].run
        return run is not None and run.handle.send(signum)

    def pids(self, key: str) -> list[int]:
        """The worker's own pid (not its launch shim's): what NVML, `ps` and the user see. Empty
        while the shim has not forked it yet, or once it is gone."""
        worker = self._workers.get(key)
        if worker is None or worker.run is None:
            return []
        if not worker.run.shim:
            return [worker.run.handle.pid]
        status = read_status(self._status_file(key))
        return [status.worker] if status is not None and status.shim == worker.run.handle.pid \
            and status.code is None else []

    def worker_pid(self, key: str, shim: int) -> int | None:
        """The pid of the worker that launch shim `shim` of `key` forked, while its status file is
        kept (until the worker is forgotten or runs again); None once it is not, or never forked."""
        return self._worker_finder(key, shim)()

    def keys(self) -> list[str]:
        """Every supervised worker: running, adopted, or waiting to restart."""
        return list(self._workers)

    def supervises(self, key: str) -> bool:
        """Whether `key` is supervised at all: running, adopted, or waiting to restart."""
        return key in self._workers

    def is_running(self, key: str) -> bool:
        worker = self._workers.get(key)
        return worker is not None and worker.run is not None and worker.run.handle.alive()

    def _applicable_cpus(self, spec: WorkerSpec) -> tuple[int, ...]:
        """The worker's CPU binding where its CPUs exist on this host; () where they do not.

        A simulated machine lists the CPUs of the box it describes, which this
        host may not have: the binding is still shown (CG_CPUS, the views),
        and that it is not applied is logged once per binding.
        """
        if not spec.cpus:
            return ()
        missing = set(spec.cpus) - os.sched_getaffinity(0)
        if not missing:
            return spec.cpus
        if spec.cpus not in self._unbound:
            self._unbound.add(spec.cpus)
            log.info("CPU binding %s (%s and others) not applied: CPUs %s are not on this host",
                     format_ranges(spec.cpus), spec.key, format_ranges(missing))
        return ()

    def _new_worker(self, spec: WorkerSpec) -> _Worker:
        if self._arbiter is None or self._closing:
            raise RuntimeError("the supervisor is not running")
        if not KEY_RE.fullmatch(spec.key):
            raise ValueError(f"worker key {spec.key!r} must match {KEY_RE.pattern}")
        if spec.key in self._workers:
            raise ValueError(f"worker {spec.key} is already supervised")
        if not spec.argv:
            raise ValueError(f"worker {spec.key}: empty command")
        if spec.shell and (len(spec.argv) < 3 or tuple(spec.argv[:2]) != SHELL):
            raise ValueError(f"worker {spec.key}: a shell command must be {' '.join(SHELL)} COMMAND")
        if os.geteuid() != 0 and spec.uid != os.geteuid():
            raise PermissionError(f"cgd runs as uid {os.geteuid()} and can not run workers as uid {spec.uid}")
        if spec.uid != 0 and spec.gid == 0:
            raise PermissionError(f"worker {spec.key}: refusing group root for uid {spec.uid}")
        return _Worker(spec, self._arbiter.spec_dir / f"{spec.key}{SPEC_SUFFIX}")

    async def _spawn(self, worker: _Worker) -> WorkerStart:
        assert self._arbiter is not None
        spec = worker.spec
        status_file = self._status_file(spec.key)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(status_file)  # an earlier run's must never be read as this one's
        cgroup = self._cgroup(spec.key)
        if cgroup is not None and not cgroups.prepare(cgroup):
            # An earlier run's, which ended while no cgd watched it: nothing of it may share the new one.
            await _end_rest(spec.key, cgroup, set(), signals.SIGKILL, 0.0)
        write_spec(str(worker.spec_file), LaunchSpec(
            argv=tuple(spec.argv), env=dict(spec.env), uid=spec.uid, gid=spec.gid,
            stdout=spec.stdout_path, stderr=spec.stderr_path, cwd=spec.cwd, status=status_file,
            cgroup=str(cgroup) if cgroup is not None else None, cpus=self._applicable_cpus(spec),
        ))
        if worker.watcher is None:
            worker.watcher = self._arbiter.add(
                spec.key, shim_argv(self._shim, str(worker.spec_file)), spec.stop_signal, spec.stop_timeout_s)
        try:
            process = await self._arbiter.spawn(worker.watcher)
        except BaseException:
            self._abandon(worker.watcher)
            raise
        handle = ProcessHandle.open(process.pid, child=True, find_group=self._worker_finder(spec.key, process.pid)) \
            if process is not None else None
        if process is None or handle is None:
            raise SpawnError(f"worker {spec.key}: circus could not start the process")
        worker.run = run = self._watch(worker, handle, process)
        await self._forked(worker, run)
        started = WorkerStart(spec.key, handle.pid, handle.create_time, self._worker_finder(spec.key, handle.pid)())
        if worker.run is run:
            # A run that ended while the shim was awaited has had its exit told already: a start
            # told after it would have the manager record a process that is gone as running.
            _call(self._on_start, started)
        return started

    async def _forked(self, worker: _Worker, run: _Run) -> None:
        """Return once the shim has forked the worker (its status file names it) or has ended.

        A start answers with the worker's own pid, the one NVML, `ps` and its
        user see; the shim forks it within a few milliseconds of its own
        start, so this polls briefly rather than watching the file.
        """
        find = self._worker_finder(worker.spec.key, run.handle.pid)
        loop = self._running_loop()
        begin = loop.time()
        while worker.run is run and find() is None and loop.time() < begin + FORK_WAIT_S:
            # Finely at first: every start waits here, and each step of the wait is latency.
            await asyncio.sleep(0.0002 if loop.time() < begin + 0.05 else 0.005)

    def _watch(self, worker: _Worker, handle: ProcessHandle, process: Process | None, shim: bool = True) -> _Run:
        run = _Run(handle, process, self._running_loop().create_future(), shim)
        handle.watch(self._running_loop(), lambda: self._exited(worker, run))
        return run

    def _exited(self, worker: _Worker, run: _Run) -> None:
        """Runs on the loop as soon as the pidfd says the process is gone."""
        pid = run.handle.pid
        if run.process is not None:
            returncode = run.process.poll()
            if worker.watcher is not None:
                worker.watcher.reap_process(pid)
        else:
            returncode = run.handle.reap()
        status = read_status(self._status_file(worker.spec.key)) if run.shim else None
        own = status if status is not None and status.shim == pid else None
        if own is not None and own.code is not None:
            returncode = own.code  # the worker's own, also when cgd is not the shim's parent
        if worker.run is run:
            worker.run = None
        if worker.wanted and not self._closing:
            # It ended on its own: what it left running is stopped before a
            # restart runs and before a stop returns (its GPUs are handed on then).
            self._cleanups[worker.spec.key] = task = self._running_loop().create_task(
                self._end_run(worker, run))
            task.add_done_callback(functools.partial(self._cleanup_done, worker.spec.key, run=run))
        else:
            run.handle.close()
        will_restart = self._after_failure(worker, run.handle.create_time, returncode)
        _resolve(run.exited, returncode)
        log.info("worker %s (pid %d) ended with %s%s", worker.spec.key, pid,
                 describe_exit(returncode, adopted=run.process is None), ", restarting" if will_restart else "")
        _call(self._on_exit, WorkerExit(worker.spec.key, pid, returncode, will_restart,
                                        own.worker if own is not None else (None if run.shim else pid)))

    async def _end_run(self, worker: _Worker, run: _Run) -> None:
        """Stop what the run left running; its cgroup goes too unless the worker runs again."""
        await _end_leftovers(worker.spec, run.handle, self._cgroup(worker.spec.key))
        if self._workers.get(worker.spec.key) is not worker:
            self._remove_cgroup(worker.spec.key)

    def _cleanup_done(self, key: str, task: asyncio.Task[None], *, run: _Run) -> None:
        run.handle.close()
        if self._cleanups.get(key) is task:
            del self._cleanups[key]
        if not task.cancelled() and task.exception() is not None:
            log.error("stopping what worker %s left running failed: %s", key, task.exception())

    async def _cleaned(self, key: str) -> None:
        """Wait until what the last run of `key` left running is gone."""
        task = self._cleanups.get(key)
        if task is not None:
            await asyncio.wait([task])

    def _after_failure(self, worker: _Worker, started: float, returncode: int | None) -> bool:
        """Count an unrequested end of a run and schedule the restart; False
        (and the worker forgotten) when it is not to be restarted."""
        if not worker.wanted or self._closing:
            return False
        policy = worker.spec.restart
        if not policy.wants_restart(returncode):
            self._forget(worker)
            return False
        if time.time() - started >= policy.reset_after_s:
            worker.failures = 0
        worker.failures += 1
        self._keep_failures(worker)
        if worker.failures > policy.max_retries:
            log.warning("worker %s failed %d times in a row: giving up", worker.spec.key, worker.failures)
            self._forget(worker)
            return False
        worker.restart = self._running_loop().call_later(
            policy.delay(worker.failures), self._restart_later, worker)
        return True

    def _restart_later(self, worker: _Worker) -> None:
        worker.restart = None
        task = self._running_loop().create_task(self._respawn(worker))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _respawn(self, worker: _Worker) -> None:
        await self._cleaned(worker.spec.key)
        async with worker.lock:
            if not worker.wanted or worker.run is not None or self._workers.get(worker.spec.key) is not worker:
                return
            try:
                await self._spawn(worker)
            except Exception as exc:
                log.error("worker %s could not be restarted: %s", worker.spec.key, exc)
                will_restart = self._after_failure(worker, time.time(), None)
                _call(self._on_exit, WorkerExit(worker.spec.key, 0, None, will_restart))

    def _abandon(self, watcher: Watcher) -> None:
        """A start cancelled half-way (cgd shutting down) must not leave a
        process nobody watches: kill what circus forked, reap it later."""
        for process in list(watcher.processes.values()):
            handle = ProcessHandle.open(process.pid, child=True)
            if handle is None:
                continue
            handle.send_group(signals.SIGKILL)
            handle.watch(self._running_loop(), functools.partial(_reap_abandoned, process, handle))

    def _forget(self, worker: _Worker) -> None:
        if self._workers.get(worker.spec.key) is worker:
            del self._workers[worker.spec.key]
        if worker.watcher is not None and self._arbiter is not None:
            self._arbiter.remove(worker.spec.key)
            worker.watcher = None
        for path in (worker.spec_file, Path(self._status_file(worker.spec.key)),
                     Path(self._failures_file(worker.spec.key))):
            path.unlink(missing_ok=True)

    def _cgroup(self, key: str) -> Path | None:
        return self.tracking.worker_dir(key)

    def _remove_cgroup(self, key: str) -> None:
        """Once nothing runs in it; a process stuck in the kernel keeps it (and is logged as left)."""
        try:
            cgroups.remove(self._cgroup(key))
        except OSError as exc:
            log.warning("worker %s: cannot remove its cgroup: %s", key, exc)

    def _status_file(self, key: str) -> str:
        return str(self._status_dir / f"{key}.status")

    def _failures_file(self, key: str) -> str:
        return str(self._status_dir / f"{key}.failures")

    def _worker_finder(self, key: str, shim: int) -> Callable[[], int | None]:
        """The pid (and process group) of the worker that shim `shim` forked, once its status file says."""
        def find() -> int | None:
            status = read_status(self._status_file(key))
            return status.worker if status is not None and status.shim == shim else None
        return find

    def _keep_failures(self, worker: _Worker) -> None:
        """Write the failures in a row where a cgd started after a kill -9 finds them (see `_failures_kept`)."""
        path = self._failures_file(worker.spec.key)
        if worker.failures == 0:
            Path(path).unlink(missing_ok=True)
            return
        tmp = f"{path}.tmp"
        Path(tmp).unlink(missing_ok=True)  # cgd may be root: never write through a planted name
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{worker.failures}\n")
        os.replace(tmp, path)

    def _failures_kept(self, key: str) -> int:
        try:
            return max(0, int(Path(self._failures_file(key)).read_text()))
        except (OSError, ValueError):
            return 0

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the supervisor is not started")
        return self._loop


WORKER_MARKS = ("CG_INSTANCE", "CG_COMPONENT", "CG_REPLICA")
"""The variables every worker process inherits (see core/workers.py): what makes a process its."""


async def _end_leftovers(spec: WorkerSpec, handle: ProcessHandle, cgroup: Path | None, *,
                         group: bool = True) -> set[int]:
    """Stop what a worker left running when its main process ended on its own.

    A worker is its whole process tree: its process group, whatever carries
    its marks after leaving the group (setsid, a double fork), and whatever is
    in its cgroup (even having cleared its environment too). They get the stop
    signal, and SIGKILL after the worker's stop timeout. `group=False` when
    the group was just stopped with the worker.
    """
    marks = {k: spec.env[k] for k in WORKER_MARKS if k in spec.env}
    pids = set(handle.group_left()) if group else set()
    if len(marks) == len(WORKER_MARKS):
        pids |= {pid for pid, _, _ in marked_processes(marks)}
    return await _end_rest(spec.key, cgroup, pids, spec.stop_signal, spec.stop_timeout_s)


async def _end_rest(key: str, cgroup: Path | None, pids: set[int], stop_signal: int, grace: float) -> set[int]:
    """Stop `pids` and everything in `cgroup` (what forks meanwhile there included): `stop_signal`,
    then SIGKILL (`cgroup.kill`) after `grace`; returns once none is left (an empty set), or logs
    and returns the pids that survived SIGKILL for KILL_WAIT_S (stuck in the kernel)."""
    def left() -> set[int]:
        return ({pid for pid in pids if start_time(pid) is not None} | cgroups.procs(cgroup)) - {os.getpid()}

    if not (pids := left()):
        return set()
    log.warning("worker %s ended and left pids %s running: stopping them", key, sorted(pids))
    loop = asyncio.get_running_loop()
    for signum, wait in ((stop_signal, grace), (signals.SIGKILL, KILL_WAIT_S)):
        if signum == signals.SIGKILL and cgroup is not None:
            cgroups.kill(cgroup)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
        deadline = loop.time() + wait
        while (pids := left()) and loop.time() < deadline:
            await asyncio.sleep(GROUP_POLL_S)
        if not pids:
            return set()
    log.warning("worker %s: pids %s survived SIGKILL (stuck in the kernel?)", key, sorted(pids))
    return pids


async def _terminate(handle: ProcessHandle, exited: asyncio.Future[int | None],
                     stop_signal: int, timeout: float) -> set[int]:
    """Stop the process and every process of its group within `timeout`,
    then SIGKILL what is left. A child that outlives its worker (a rank that
    ignores SIGTERM) keeps its GPU memory, and the worker's GPUs are handed
    on once this returns: the worker has stopped only when its group has.
    Returns the pids that survived SIGKILL for KILL_WAIT_S (none, normally)."""
    handle.send_group(stop_signal)
    if await _stopped(handle, exited, timeout):
        return set()
    log.warning("pid %d: pids %s still run %.1fs after the stop signal: SIGKILL",
                handle.pid, _pids(handle), timeout)
    handle.send_group(signals.SIGKILL)
    if await _stopped(handle, exited, KILL_WAIT_S):
        return set()
    log.warning("pid %d: pids %s survived SIGKILL for %.0fs (stuck in the kernel?)",
                handle.pid, _pids(handle), KILL_WAIT_S)
    return set(handle.group_left()) | ({handle.pid} if not exited.done() else set())


class WorkerStuck(Exception):
    """Processes of a worker outlived SIGKILL (stuck in the kernel): it is not stopped yet."""

    def __init__(self, key: str, pids: Collection[int]) -> None:
        super().__init__(f"{key}: pids {', '.join(map(str, sorted(pids)))} still run after SIGKILL")
        self.key = key
        self.pids = tuple(sorted(pids))


async def _stopped(handle: ProcessHandle, exited: asyncio.Future[int | None], timeout: float) -> bool:
    """Whether the process exited and then the rest of its group within
    `timeout`. The exit is seen at once through the pidfd; the group's other
    members are not our children, so they are polled."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, timeout)
    try:
        await asyncio.wait_for(asyncio.shield(exited), max(0.0, timeout))
    except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
        return False
    while handle.group_left():
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(GROUP_POLL_S)
    return True


def _pids(handle: ProcessHandle) -> str:
    return ", ".join(map(str, handle.group_left())) or "none"


def _reap_abandoned(process: Process, handle: ProcessHandle) -> None:
    process.poll()
    handle.close()


def _resolve(future: asyncio.Future[T], value: T) -> None:
    if not future.done():
        future.set_result(value)


def _call(callback: Callable[[T], None] | None, value: T) -> None:
    """A failing callback is the manager's bug; it must not stop supervision."""
    if callback is None:
        return
    try:
        callback(value)
    except Exception:
        log.exception("supervisor callback %r failed for %r", callback, value)
