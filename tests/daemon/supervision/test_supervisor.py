"""The supervisor with a real circus arbiter and real worker processes.

Each test runs its own event loop (`asyncio.run`) and its own Supervisor;
workers are small Python programs that leave their pid, environment and
output where the test can check them in /proc and in their log files.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import psutil
import pytest

from computegroups.daemon.supervision import processes, supervisor
from computegroups.daemon.supervision.launch import LaunchSpec
from computegroups.daemon.supervision.supervisor import RestartPolicy, Supervisor, WorkerExit, WorkerSpec, WorkerStart
from tests.daemon_fixture import wait_for

SLEEPER = "import time\nwhile True: time.sleep(0.05)\n"
GRACEFUL = textwrap.dedent("""
    import signal, sys, time
    def term(*_):
        print('got SIGTERM', flush=True)
        sys.exit(0)
    def usr1(*_):
        print('got SIGUSR1', flush=True)
    signal.signal(signal.SIGTERM, term)
    signal.signal(signal.SIGUSR1, usr1)
    print('ready', flush=True)
    while True: time.sleep(0.05)
""")

CHILD_IGNORES_TERM = ("import signal, time\n"
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      "print('child ready', flush=True)\n"
                      "time.sleep(60)\n")
CHILD_SLOW_ON_TERM = textwrap.dedent("""
    import signal, sys, time
    def term(*_):
        time.sleep(0.4)
        print('child done', flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    print('child ready', flush=True)
    while True: time.sleep(0.05)
""")


def parent_of(child_code: str, ignore_term: bool = False) -> str:
    """A worker that starts `child_code` in its own process group and
    prints the child's pid; it dies at once of SIGTERM unless `ignore_term`
    (which its child then inherits)."""
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else ""
    return (f"import signal, subprocess, sys, time\n{ignore}"
            f"child = subprocess.Popen([sys.executable, '-c', {child_code!r}])\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(60)\n")


class Recorder:
    """The callbacks, with the time each event arrived."""

    def __init__(self) -> None:
        self.exits: list[tuple[float, WorkerExit]] = []
        self.starts: list[tuple[float, WorkerStart]] = []

    def on_exit(self, event: WorkerExit) -> None:
        self.exits.append((time.time(), event))

    def on_start(self, event: WorkerStart) -> None:
        self.starts.append((time.time(), event))

    async def wait_exits(self, n: int, timeout: float = 10.0) -> list[WorkerExit]:
        await until(lambda: len(self.exits) >= n, timeout)
        return [e for _, e in self.exits]


async def until(check: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def spec_for(tmp_path: Path, key: str, code: str, **overrides: object) -> WorkerSpec:
    logs = tmp_path / "logs"
    fields: dict[str, object] = dict(
        key=key, argv=(sys.executable, "-c", code),
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CG_COMPONENT": key,
             "ODD": "spaces and = and 'quotes' and $(circus.env.path)"},
        cwd=str(tmp_path), uid=os.getuid(), gid=os.getgid(),
        stdout_path=str(logs / f"{key}.out"), stderr_path=str(logs / f"{key}.err"),
        restart=RestartPolicy(max_retries=0), stop_timeout_s=5.0,
    )
    fields.update(overrides)
    return WorkerSpec(**fields)  # type: ignore[arg-type]


def run_with(tmp_path: Path, body: Callable[[Supervisor, Recorder], Awaitable[None]],
             keep_workers: bool = False) -> Recorder:
    recorder = Recorder()

    async def main() -> None:
        sup = Supervisor(tmp_path / "run", recorder.on_exit, recorder.on_start)
        await sup.start()
        try:
            await body(sup, recorder)
        finally:
            await sup.stop(keep_workers=keep_workers)

    asyncio.run(main())
    return recorder


def proc_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode().split("=", 1) for item in raw.split(b"\0") if item)


def status_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    raise KeyError(name)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def child_in(log: Path) -> int:
    """The pid a `parent_of` worker printed, once its child is ready."""
    await until(lambda: log.exists() and "child ready" in log.read_text())
    return next(int(line) for line in log.read_text().split() if line.isdigit())


async def worker_of(sup: Supervisor, key: str) -> int:
    """The worker's own pid, once its launch shim (the process cgd watches) has forked it."""
    await until(lambda: sup.pids(key))
    return sup.pids(key)[0]


def kill_and_reap(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def test_worker_gets_exactly_its_env_argv_cwd_and_default_signals(tmp_path: Path) -> None:
    code = "import sys, time\nprint('argv', sys.argv[1:], flush=True)\ntime.sleep(30)\n"
    spec = spec_for(tmp_path, "env.0", code, argv=(sys.executable, "-c", code, "a b", "$(circus.wid)"))

    async def body(sup: Supervisor, rec: Recorder) -> None:
        started = await sup.start_worker(spec)
        log = Path(spec.stdout_path)
        await until(lambda: log.exists() and "argv" in log.read_text())
        pid = await worker_of(sup, "env.0")
        assert psutil.Process(pid).ppid() == started.pid  # its launch shim, the process cgd watches
        assert proc_environ(started.pid) == {}  # the shim's own: nothing of the worker's env reaches root
        assert proc_environ(pid) == dict(spec.env)
        assert psutil.Process(pid).cmdline() == list(spec.argv)
        assert os.readlink(f"/proc/{pid}/cwd") == str(tmp_path)
        assert os.getpgid(pid) == pid != os.getpgid(started.pid)  # its own group: stops reach it, not the shim
        assert sup.is_running("env.0")
        assert started.create_time == psutil.Process(started.pid).create_time()
        assert log.read_text() == "argv ['a b', '$(circus.wid)']\n"

    rec = run_with(tmp_path, body)
    assert [e.will_restart for _, e in rec.exits] == [False]


def test_worker_starts_with_no_signal_ignored_or_blocked(tmp_path: Path) -> None:
    """Python (cgd, the launch shim) ignores SIGPIPE and SIGXFSZ; a worker must not inherit that."""
    spec = spec_for(tmp_path, "sig.0", "", argv=("cat", "/proc/self/status"))

    async def body(sup: Supervisor, rec: Recorder) -> None:
        await sup.start_worker(spec)
        await rec.wait_exits(1)

    run_with(tmp_path, body)
    status = dict(line.split(":", 1) for line in Path(spec.stdout_path).read_text().splitlines())
    assert int(status["SigIgn"], 16) == 0 and int(status["SigBlk"], 16) == 0


def test_control_endpoints_are_private(tmp_path: Path) -> None:
    async def body(sup: Supervisor, rec: Recorder) -> None:
        private = tmp_path / "run" / "circus"
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        assert {p.name for p in private.iterdir()} >= {"control.sock", "events.sock"}
        spec = spec_for(tmp_path, "priv.0", SLEEPER)
        await sup.start_worker(spec)
        launch_spec = private / "specs" / "priv.0.spec"
        assert stat.S_IMODE(launch_spec.stat().st_mode) == 0o600
        assert LaunchSpec.decode(launch_spec.read_bytes()).env == dict(spec.env)

    run_with(tmp_path, body)
    assert not (tmp_path / "run" / "circus" / "control.sock").exists()
    assert not (tmp_path / "run" / "circus" / "specs" / "priv.0.spec").exists()


def test_stop_worker_is_graceful_and_never_restarts(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, "grace.0", GRACEFUL, restart=RestartPolicy(max_retries=5, backoff_s=0.01))

    async def body(sup: Supervisor, rec: Recorder) -> None:
        started = await sup.start_worker(spec)
        log = Path(spec.stdout_path)
        await until(lambda: "ready" in log.read_text())
        assert sup.signal("grace.0", signal.SIGUSR1)
        await until(lambda: "got SIGUSR1" in log.read_text())
        await sup.stop_worker("grace.0")
        assert gone(started.pid)
        assert sup.keys() == [] and not sup.is_running("grace.0") and sup.pids("grace.0") == []
        await asyncio.sleep(0.1)
        await sup.stop_worker("grace.0")

    rec = run_with(tmp_path, body)
    assert Path(spec.stdout_path).read_text().splitlines()[-1] == "got SIGTERM"
    assert [(e.returncode, e.will_restart) for _, e in rec.exits] == [(0, False)]
    assert len(rec.starts) == 1


def test_stop_worker_kills_after_the_timeout_with_its_children(tmp_path: Path) -> None:
    code = ("import signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "child = subprocess.Popen(['sleep', '60'])\n"
            "print(child.pid, flush=True)\n"
            "time.sleep(60)\n")
    spec = spec_for(tmp_path, "stubborn.0", code)

    async def body(sup: Supervisor, rec: Recorder) -> None:
        started = await sup.start_worker(spec)
        log = Path(spec.stdout_path)
        await until(lambda: log.read_text().strip())
        child = int(log.read_text())
        began = time.monotonic()
        await sup.stop_worker("stubborn.0", timeout=0.3)
        took = time.monotonic() - began
        print(f"stop with a 0.3 s timeout took {took:.3f} s")
        assert 0.3 <= took < 3.0
        assert gone(started.pid)
        await until(lambda: gone(child))

    rec = run_with(tmp_path, body)
    assert [(e.returncode, e.will_restart) for _, e in rec.exits] == [(-signal.SIGKILL, False)]


def test_stop_worker_waits_for_a_child_that_outlives_it_then_kills_it(tmp_path: Path) -> None:
    """The worker dies of SIGTERM at once; its child ignores it and would
    keep the GPU's memory after the worker's group is released."""
    spec = spec_for(tmp_path, "orphaning.0", parent_of(CHILD_IGNORES_TERM))

    async def body(sup: Supervisor, rec: Recorder) -> None:
        started = await sup.start_worker(spec)
        child = await child_in(Path(spec.stdout_path))
        began = time.monotonic()
        await sup.stop_worker("orphaning.0", timeout=0.5)
        took = time.monotonic() - began
        assert gone(started.pid) and gone(child)
        assert 0.5 <= took < 3.0

    rec = run_with(tmp_path, body)
    assert [(e.returncode, e.will_restart) for _, e in rec.exits] == [(-signal.SIGTERM, False)]


def test_stop_worker_lets_the_group_finish_within_the_timeout(tmp_path: Path) -> None:
    """No SIGKILL for a child that takes a while to exit after SIGTERM."""
    spec = spec_for(tmp_path, "cleanup.0", parent_of(CHILD_SLOW_ON_TERM))

    async def body(sup: Supervisor, rec: Recorder) -> None:
        await sup.start_worker(spec)
        child = await child_in(Path(spec.stdout_path))
        began = time.monotonic()
        await sup.stop_worker("cleanup.0", timeout=5.0)
        took = time.monotonic() - began
        assert gone(child)
        assert 0.4 <= took < 3.0

    run_with(tmp_path, body)
    assert Path(spec.stdout_path).read_text().splitlines()[-1] == "child done"


def test_stop_worker_kills_a_group_that_ignores_sigterm(tmp_path: Path) -> None:
    """The child holds memory, as a GPU worker does: freeing it makes the
    child die of SIGKILL later than the worker, and the stop must wait."""
    child_code = "ballast = b'x' * 2 ** 28\n" + CHILD_IGNORES_TERM
    spec = spec_for(tmp_path, "deaf.0", parent_of(child_code, ignore_term=True))

    async def body(sup: Supervisor, rec: Recorder) -> None:
        started = await sup.start_worker(spec)
        child = await child_in(Path(spec.stdout_path))
        began = time.monotonic()
        await sup.stop_worker("deaf.0", timeout=0.3)
        took = time.monotonic() - began
        assert gone(started.pid) and gone(child)
        assert 0.3 <= took < 3.0

    rec = run_with(tmp_path, body)
    assert [(e.returncode, e.will_restart) for _, e in rec.exits] == [(-signal.SIGKILL, False)]


def test_stop_worker_gives_up_on_a_group_stuck_in_the_kernel(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A process in uninterruptible sleep outlives SIGKILL; the stop must
    still end, saying which pids are left."""
    stuck = 4_000_000_123
    monkeypatch.setattr(supervisor, "KILL_WAIT_S", 0.3)
    monkeypatch.setattr(processes.ProcessHandle, "group_left", lambda self: [stuck])
    spec = spec_for(tmp_path, "stuck.0", SLEEPER)

    async def body(sup: Supervisor, rec: Recorder) -> None:
        await sup.start_worker(spec)
        began = time.monotonic()
        await sup.stop_worker("stuck.0", timeout=0.2)
        assert 0.5 <= time.monotonic() - began < 3.0
        assert sup.keys() == []

    run_with(tmp_path, body)
    assert any(r.levelname == "WARNING" and str(stuck) in r.getMessage() and "survived SIGKILL" in r.getMessage()
               for r in caplog.records)


def test_a_stop_that_must_hold_a_stuck_worker_fails_naming_it_and_a_later_stop_ends_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A release (`hold_if_stuck`) must not hand on the devices of a process that outlived
    SIGKILL: the stop fails with its pids and the worker stays known until a stop sees it gone."""
    stuck = 4_000_000_123
    monkeypatch.setattr(supervisor, "KILL_WAIT_S", 0.3)
    spec = spec_for(tmp_path, "held.0", SLEEPER)

    async def body(sup: Supervisor, rec: Recorder) -> None:
        await sup.start_worker(spec)
        with monkeypatch.context() as kernel:
            kernel.setattr(processes.ProcessHandle, "group_left", lambda self: [stuck])
            with pytest.raises(supervisor.WorkerStuck, match=f"held.0: pids .*{stuck}"):
                await sup.stop_worker("held.0", timeout=0.2, hold_if_stuck=True)
            assert sup.keys() == ["held.0"], "kept, so that the next stop looks again"
        await sup.stop_worker("held.0", timeout=0.2, hold_if_stuck=True)
        assert sup.keys() == []

    run_with(tmp_path, body)


def test_restart_backs_off_then_gives_up(tmp_path: Path) -> None:
    policy = RestartPolicy(max_retries=3, backoff_s=0.05, backoff_max_s=0.15)
    spec = spec_for(tmp_path, "crash.0", "import sys\nprint('run', flush=True)\nsys.exit(3)\n", restart=policy)

    async def body(sup: Supervisor, rec: Recorder) -> None:
        await sup.start_worker(spec)
        await rec.wait_exits(4)
        await until(lambda: sup.keys() == [])

    rec = run_with(tmp_path, body)
    exits = [e for _, e in rec.exits]
    assert [(e.returncode, e.will_restart) for e in exits] == [(3, True), (3, True), (3, True), (3, False)]
    assert len(rec.starts) == 4 and len({s.pid for _, s in rec.starts}) == 4
    assert [e.pid for e in exits] == [s.pid for _, s in rec.starts]
    assert Path(spec.stdout_path).read_text() == "run\n" * 4
    gaps = [rec.starts[i + 1][0] - rec.exits[i][0] for i in range(3)]
    print("restart delays (backoff 0.05, 0.1, 0.15 capped):", ", ".join(f"{g:.3f}" for g in gaps))
    assert all(g >= d * 0.9 for g, d in zip(gaps, (0.05, 0.1, 0.15), strict=True))
    assert policy.delay(1) == 0.05 and policy.delay(2) == 0.1 and policy.delay(3) == 0.15


def test_a_long_run_resets_the_failure_count(tmp_path: Path) -> None:
    policy = RestartPolicy(max_retries=1, backoff_s=0.01, reset_after_s=0.0)
    spec = spec_for(tmp_path, "flaky.0", "import sys\nsys.exit(1)\n", restart=policy)

    async def body(sup: Supervisor, rec: Recorder) -> None:
        await sup.start_worker(spec)
        await rec.wait_exits(4)
        await sup.stop_worker("flaky.0")

    rec = run_with(tmp_path, body)
    assert all(e.will_restart for _, e in rec.exits[:4])


def test_exit_is_reported_within_milliseconds(tmp_path: Path) -> None:
    stamp = tmp_path / "exit-time"
    code = (f"import os, time\ntime.sleep(0.2)\nopen({str(stamp)!r}, 'w').write(repr(time.time()))\n"
            "os._exit(7)\n")
    spec = spec_for(tmp_path, "fast.0", code)
    killed_at: list[float] = []

    async def body(sup: Supervisor, rec: Recorder) -> None:
        await sup.start_worker(spec)
        await rec.wait_exits(1)
        await sup.start_worker(spec_for(tmp_path, "fast.1", SLEEPER))
        victim = await worker_of(sup, "fast.1")
        # Killed once it runs its own program, not while the launch shim sets it up.
        await until(lambda: SLEEPER.encode() in Path(f"/proc/{victim}/cmdline").read_bytes())
        killed_at.append(time.time())
        os.kill(victim, signal.SIGKILL)
        await rec.wait_exits(2)

    rec = run_with(tmp_path, body)
    exit_latency = rec.exits[0][0] - float(stamp.read_text())
    kill_latency = rec.exits[1][0] - killed_at[0]
    print(f"exit callback latency: {exit_latency * 1000:.1f} ms after exit, "
          f"{kill_latency * 1000:.1f} ms after SIGKILL")
    assert rec.exits[0][1].returncode == 7 and rec.exits[1][1].returncode == -signal.SIGKILL
    assert exit_latency < 1.0 and kill_latency < 1.0


def test_exit_is_seen_without_pidfd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "HAVE_PIDFD", False)
    spec = spec_for(tmp_path, "poll.0", "import time, sys\ntime.sleep(0.2)\nsys.exit(4)\n")

    async def body(sup: Supervisor, rec: Recorder) -> None:
        started = await sup.start_worker(spec)
        assert sup.is_running("poll.0")
        await rec.wait_exits(1)
        assert gone(started.pid)

    rec = run_with(tmp_path, body)
    assert rec.exits[0][1].returncode == 4


def test_kept_workers_keep_logging_and_are_adopted_by_the_next_supervisor(tmp_path: Path) -> None:
    code = "import itertools, time\nfor i in itertools.count():\n    print(i, flush=True)\n    time.sleep(0.02)\n"
    spec = spec_for(tmp_path, "keep.0", code, restart=RestartPolicy(max_retries=2, backoff_s=0.01))
    kept: list[WorkerStart] = []

    async def first(sup: Supervisor, rec: Recorder) -> None:
        kept.append(await sup.start_worker(spec))
        await until(lambda: Path(spec.stdout_path).stat().st_size > 0)

    first_rec = run_with(tmp_path, first, keep_workers=True)
    assert first_rec.exits == []
    shim = kept[0]
    (worker,) = psutil.Process(shim.pid).children()
    try:
        assert not gone(shim.pid)
        size = Path(spec.stdout_path).stat().st_size
        wait_for(lambda: Path(spec.stdout_path).stat().st_size > size, "the kept worker logs on")

        async def second(sup: Supervisor, rec: Recorder) -> None:
            assert not sup.adopt(spec, shim.pid, shim.create_time + 100)
            assert not sup.adopt(spec, 2 ** 22 + 7, shim.create_time)
            assert sup.adopt(spec, shim.pid, shim.create_time)
            assert sup.is_running("keep.0") and sup.pids("keep.0") == [worker.pid]
            await asyncio.sleep(0.1)
            assert rec.starts == []
            os.kill(worker.pid, signal.SIGKILL)
            await until(lambda: len(rec.starts) == 1)
            restarted = await worker_of(sup, "keep.0")
            assert sup.pids("keep.0") == [restarted] and restarted != worker.pid

        rec = run_with(tmp_path, second)
    finally:
        kill_and_reap(worker.pid)
        kill_and_reap(shim.pid)
    assert [(e.pid, e.will_restart) for _, e in rec.exits] == [(shim.pid, True), (rec.starts[0][1].pid, False)]
    assert rec.exits[0][1].returncode == -signal.SIGKILL  # not cgd's child, yet its status is known


def test_an_adopted_worker_that_exits_0_is_known_to_have_exited_0(tmp_path: Path) -> None:
    """Its launch shim, its parent, writes how it ended: `on-failure` does not run it again."""
    def exits_as_told(go: Path) -> str:
        return (f"import os, sys, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
                f"sys.exit(int(open({str(go)!r}).read()))\n")

    policy = RestartPolicy(mode=supervisor.RestartMode.ON_FAILURE, max_retries=3, backoff_s=0.01)
    jobs = {key: spec_for(tmp_path, key, exits_as_told(tmp_path / key), restart=policy)
            for key in ("done.0", "crash.0")}
    kept: dict[str, WorkerStart] = {}

    async def first(sup: Supervisor, rec: Recorder) -> None:
        for key, spec in jobs.items():
            kept[key] = await sup.start_worker(spec)
            await worker_of(sup, key)

    run_with(tmp_path, first, keep_workers=True)

    async def second(sup: Supervisor, rec: Recorder) -> None:
        for key, spec in jobs.items():
            assert sup.adopt(spec, kept[key].pid, kept[key].create_time)
        (tmp_path / "done.0").write_text("0")
        (tmp_path / "crash.0").write_text("3")
        await rec.wait_exits(2)
        await until(lambda: len(rec.starts) == 1)

    rec = run_with(tmp_path, second)
    ended = {e.key: (e.returncode, e.will_restart) for _, e in rec.exits[:2]}
    assert ended == {"done.0": (0, False), "crash.0": (3, True)}
    assert [s.key for _, s in rec.starts] == ["crash.0"]


def test_the_stop_signal_reaches_the_worker_once_and_others_pass_through_the_shim(tmp_path: Path) -> None:
    counting = textwrap.dedent("""
        import signal, sys, time
        def note(signum, _):
            print(signal.Signals(signum).name, flush=True)
            if signum == signal.SIGTERM:
                time.sleep(0.3)
                sys.exit(0)
        signal.signal(signal.SIGTERM, note)
        signal.signal(signal.SIGUSR1, note)
        print('ready', flush=True)
        while True: time.sleep(0.05)
    """)
    spec = spec_for(tmp_path, "once.0", counting)
    log = Path(spec.stdout_path)

    async def body(sup: Supervisor, rec: Recorder) -> None:
        started = await sup.start_worker(spec)
        await until(lambda: log.exists() and "ready" in log.read_text())
        assert sup.signal("once.0", signal.SIGUSR1)  # to the shim, which passes it on
        await until(lambda: log.read_text().count("SIGUSR1") == 1)
        os.kill(started.pid, signal.SIGUSR1)  # a user's kill of the pid cgd watches
        await until(lambda: log.read_text().count("SIGUSR1") == 2)
        await sup.stop_worker("once.0")

    run_with(tmp_path, body)
    assert log.read_text().split() == ["ready", "SIGUSR1", "SIGUSR1", "SIGTERM"]


def test_workers_survive_kill9_of_the_daemon_and_are_adopted(tmp_path: Path) -> None:
    spec = spec_for(tmp_path, "orphan.0", GRACEFUL)
    script = textwrap.dedent(f"""
        import asyncio, json, sys
        from pathlib import Path
        from computegroups.daemon.supervision.supervisor import Supervisor, WorkerSpec, RestartPolicy
        async def main():
            sup = Supervisor(Path({str(tmp_path / 'run1')!r}), lambda e: None)
            await sup.start()
            spec = WorkerSpec(**json.loads(sys.argv[1]))
            started = await sup.start_worker(spec)
            print(json.dumps([started.pid, started.create_time]), flush=True)
            await asyncio.sleep(60)
        asyncio.run(main())
    """)
    fields = {k: getattr(spec, k) for k in ("key", "argv", "env", "cwd", "uid", "gid",
                                              "stdout_path", "stderr_path")}
    daemon = subprocess.Popen([sys.executable, "-c", script, json.dumps(fields)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert daemon.stdout is not None
        pid, create_time = json.loads(daemon.stdout.readline())
        daemon.kill()
        daemon.wait()
        assert not gone(pid)

        async def adopt(sup: Supervisor, rec: Recorder) -> None:
            assert sup.adopt(spec, pid, create_time)
            await until(lambda: "ready" in Path(spec.stdout_path).read_text())
            await sup.stop_worker("orphan.0")
            assert gone(pid)

        rec = run_with(tmp_path, adopt)
    finally:
        kill_and_reap(pid)
        daemon.stdout.close()  # type: ignore[union-attr]
    assert [(e.pid, e.will_restart) for _, e in rec.exits] == [(pid, False)]
    assert Path(spec.stdout_path).read_text().splitlines()[-1] == "got SIGTERM"


def test_stop_stray_checks_the_start_time(tmp_path: Path) -> None:
    launcher = subprocess.run(["/bin/sh", "-c", "setsid sleep 60 >/dev/null 2>&1 & echo $!"],
                              capture_output=True, text=True, check=True)
    stray = int(launcher.stdout)
    try:
        create_time = psutil.Process(stray).create_time()

        async def body(sup: Supervisor, rec: Recorder) -> None:
            assert not await sup.stop_stray(stray, create_time - 50, timeout=0.5)
            assert not gone(stray)
            assert await sup.stop_stray(stray, create_time, timeout=2.0)
            assert gone(stray)
            assert not await sup.stop_stray(stray, create_time, timeout=2.0)

        run_with(tmp_path, body)
    finally:
        kill_and_reap(stray)


def test_stop_stray_stops_its_whole_group(tmp_path: Path) -> None:
    log = tmp_path / "stray.out"
    with log.open("w") as out:
        stray = subprocess.Popen([sys.executable, "-c", parent_of(CHILD_IGNORES_TERM)],
                                 stdout=out, start_new_session=True)
    try:
        async def body(sup: Supervisor, rec: Recorder) -> None:
            child = await child_in(log)
            assert await sup.stop_stray(stray.pid, psutil.Process(stray.pid).create_time(), timeout=0.5)
            assert gone(stray.pid) and gone(child)

        run_with(tmp_path, body)
    finally:
        stray.kill()
        stray.wait()


def test_stop_all_stops_every_worker(tmp_path: Path) -> None:
    pids: list[int] = []

    async def body(sup: Supervisor, rec: Recorder) -> None:
        for i in range(3):
            pids.append((await sup.start_worker(spec_for(tmp_path, f"many.{i}", GRACEFUL))).pid)
        assert sorted(sup.keys()) == ["many.0", "many.1", "many.2"]

    began = time.monotonic()
    rec = run_with(tmp_path, body)
    print(f"3 workers started and stopped in {time.monotonic() - began:.2f} s")
    assert all(gone(pid) for pid in pids)
    assert sorted((e.key, e.will_restart) for _, e in rec.exits) == [
        ("many.0", False), ("many.1", False), ("many.2", False)]


def test_shell_mode_and_missing_programs(tmp_path: Path) -> None:
    shell = spec_for(tmp_path, "sh.0", "", argv=("/bin/sh", "-c", "echo $0 $1; exec sleep 30", "zero", "one"),
                     shell=True)
    missing = spec_for(tmp_path, "missing.0", "", argv=("no-such-program-here",))

    async def body(sup: Supervisor, rec: Recorder) -> None:
        await sup.start_worker(shell)
        await sup.start_worker(missing)
        await until(lambda: Path(shell.stdout_path).read_text() == "zero one\n")
        await until(lambda: len(rec.exits) == 1)

    rec = run_with(tmp_path, body)
    assert rec.exits[0][1].key == "missing.0" and rec.exits[0][1].returncode == 127
    assert "no-such-program-here" in Path(missing.stderr_path).read_text()


def test_a_start_cancelled_half_way_leaves_no_process(tmp_path: Path) -> None:
    marker = f"cancelled-start-{os.getpid()}"
    spec = spec_for(tmp_path, "cancel.0", SLEEPER, argv=(sys.executable, "-c", SLEEPER, marker))

    def mine() -> list[psutil.Process]:
        found = []
        for child in psutil.Process().children(recursive=True):
            try:
                words = child.cmdline()
                if marker in words or any(w.endswith("cancel.0.spec") for w in words):
                    found.append(child)
            except psutil.Error:
                pass
        return found

    async def body(sup: Supervisor, rec: Recorder) -> None:
        task = asyncio.get_running_loop().create_task(sup.start_worker(spec))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert sup.keys() == [] and rec.starts == []
        await until(lambda: not mine())

    run_with(tmp_path, body)


def test_bad_specs_are_refused(tmp_path: Path) -> None:
    async def body(sup: Supervisor, rec: Recorder) -> None:
        await sup.start_worker(spec_for(tmp_path, "dup.0", SLEEPER))
        with pytest.raises(ValueError, match="already supervised"):
            await sup.start_worker(spec_for(tmp_path, "dup.0", SLEEPER))
        with pytest.raises(ValueError, match="key"):
            await sup.start_worker(spec_for(tmp_path, "Bad Key", SLEEPER))
        with pytest.raises(ValueError, match="shell"):
            await sup.start_worker(spec_for(tmp_path, "sh.0", SLEEPER, shell=True))
        with pytest.raises(KeyError):
            sup.signal("nobody.0", signal.SIGUSR1)
        assert sup.keys() == ["dup.0"]

    run_with(tmp_path, body)


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_workers_run_as_their_owner(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    spec = spec_for(tmp_path, "nobody.0", "", argv=("/bin/sh", "-c", "id -u; id -g; exec sleep 30"),
                    uid=65534, gid=65534, cwd="/", env={"PATH": "/usr/bin:/bin", "HOME": "/"})

    async def body(sup: Supervisor, rec: Recorder) -> None:
        started = await sup.start_worker(spec)
        await until(lambda: Path(spec.stdout_path).read_text() == "65534\n65534\n")
        assert status_field(started.pid, "Uid").split() == ["65534"] * 4
        assert status_field(started.pid, "Gid").split() == ["65534"] * 4
        assert status_field(started.pid, "Groups").split() == ["65534"]
        for path in (spec.stdout_path, spec.stderr_path):
            st = os.stat(path)
            assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 65534, 0o640)
        assert os.stat(logs / "nobody.0.out").st_uid == 65534

    run_with(tmp_path, body)


def test_an_exit_is_told_as_a_status_a_signal_name_or_why_it_is_unknown() -> None:
    assert supervisor.describe_exit(0) == "status 0"
    assert supervisor.describe_exit(-signal.SIGTERM) == "signal SIGTERM"
    assert supervisor.describe_exit(None, adopted=True).startswith("an unknown status (its launch shim")
    assert WorkerExit("w.0", 0, None, False).status == "no status (it could not be started)"
    assert WorkerExit("w.0", 41, -signal.SIGKILL, True).status == "signal SIGKILL"


def test_a_start_is_told_with_the_worker_pid_and_never_after_its_exit(tmp_path: Path) -> None:
    """A shim that ends before forking (here: its cwd is gone) has its exit told while the start
    still waits for the fork; the start must not be told after it, or the manager would record a
    process that is gone as running. Starts and exits name the worker's own pid beside the shim's."""
    gone_cwd = spec_for(tmp_path, "gone.0", SLEEPER, cwd=str(tmp_path / "no-such-dir"))
    sleeper = spec_for(tmp_path, "sleeper.0", SLEEPER)
    seen: dict[str, int] = {}

    async def body(sup: Supervisor, rec: Recorder) -> None:
        started = await sup.start_worker(gone_cwd)
        await rec.wait_exits(1)
        assert started.worker is None
        started = await sup.start_worker(sleeper)
        seen["worker"] = await worker_of(sup, "sleeper.0")
        assert started.worker == seen["worker"] != started.pid
        assert sup.worker_pid("sleeper.0", started.pid) == seen["worker"]
        os.kill(seen["worker"], signal.SIGKILL)
        await rec.wait_exits(2)

    rec = run_with(tmp_path, body)
    assert [e.key for _, e in rec.exits] == ["gone.0", "sleeper.0"]
    assert [s.key for _, s in rec.starts] == ["sleeper.0"], "no start told for the run whose exit was told"
    assert rec.starts[0][1].worker == rec.exits[1][1].worker == seen["worker"]
    assert rec.exits[0][1].worker is None
