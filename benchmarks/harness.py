"""A real cgd on a simulated machine, and what the benchmarks read from /proc.

The daemon is the one the end-to-end tests start (`tests.daemon_fixture.Cgd`),
so a benchmark measures exactly what the tests check. Worker facts come from
/proc, never from cgd's own answer: a benchmark that counts violations must
see the processes as the kernel does.
"""

from __future__ import annotations

import compileall
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from tests.daemon_fixture import Cgd

T = TypeVar("T")
SLEEP = (shutil.which("sleep") or "/bin/sleep", "86400")
"""The cheapest worker there is: what is measured is cgd, not the worker's start-up."""

TICKS = os.sysconf("SC_CLK_TCK")
REPO = Path(__file__).resolve().parent.parent
SOURCES = ("daemon", "cli", "topology", "statefiles", "benchmarks", "tests")
"""The repository's folders of Python modules: the installed project and what the benchmarks run."""


def compile_bytecode() -> None:
    """Compile the project's modules as installing it does.

    A program's start-up is timed as users meet it: an installed package
    comes with its bytecode, while an editable install under
    PYTHONDONTWRITEBYTECODE would compile every module from source on every
    start.
    """
    for folder in SOURCES:
        if not compileall.compile_dir(REPO / folder, quiet=1):
            raise RuntimeError(f"compiling {REPO / folder} failed")


@contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A short-lived directory, short enough for a Unix socket path under it."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def running_cgd(machine: str = "dgx-h100", config: str | None = None) -> Iterator[Cgd]:
    """A daemon that is stopped, and whose workers are killed, however the benchmark ends."""
    with scratch("cg-bench-") as root:
        extra: tuple[str, ...] = ()
        if config is not None:
            (root / "cgd.toml").write_text(config)
            extra = ("--config", str(root / "cgd.toml"))
        cgd = Cgd(root, machine, extra)
        try:
            yield cgd.start()
        finally:
            cgd.cleanup()


def timed_start(cgd: Cgd, timeout: float = 60.0) -> float:
    """Start cgd and return the seconds until it answers, polled every 5 ms.

    `Cgd.start` polls every 50 ms, too coarse for a figure of a few hundred.
    """
    (cgd.root / "run").mkdir(parents=True, exist_ok=True)
    with open(cgd.stderr_path, "ab") as stderr:
        begin = time.perf_counter()
        cgd.proc = subprocess.Popen(
            cgd.command(), env=cgd.env(), stdin=subprocess.DEVNULL,
            stdout=stderr, stderr=stderr, start_new_session=True,
        )
    deadline = begin + timeout
    while time.perf_counter() < deadline:
        if cgd.proc.poll() is not None:
            raise RuntimeError(f"cgd exited with {cgd.proc.returncode}:\n{cgd.log()}")
        try:
            if cgd.request("GET", "/v1/version", timeout=1.0)[0] == 200:
                return time.perf_counter() - begin
        except OSError:
            pass
        time.sleep(0.005)
    raise RuntimeError(f"cgd did not answer within {timeout}s:\n{cgd.log()}")


def wait_for(predicate: Callable[[], T | None], timeout: float = 30.0, interval: float = 0.002) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s")
        time.sleep(interval)


def process_env(pid: int) -> dict[str, str] | None:
    """The environment a process was exec'd with; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    return dict(item.decode(errors="replace").split("=", 1) for item in raw.split(b"\0") if b"=" in item)


def worker_running(pid: int, variable: str = "CG_COMPONENT") -> dict[str, str] | None:
    """The worker's environment once the launch shim has exec'd into it, else None."""
    env = process_env(pid)
    return env if env and variable in env else None


def marked_processes(variable: str, value: str) -> dict[int, dict[str, str]]:
    """Every live process whose environment carries `variable=value`, with that environment."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            env = process_env(int(entry))
            if env is not None and env.get(variable) == value and not _zombie(int(entry)):
                found[int(entry)] = env
    return found


def gpus_over_capacity(envs: Iterable[dict[str, str]], memory_var: str, capacity_mib: int) -> int:
    """GPUs whose live processes, by their own environment, hold more than the GPU has.

    A process without `memory_var` holds its GPUs whole.
    """
    held: dict[str, int] = {}
    for env in envs:
        gpus = [g for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
        shares = env.get(memory_var, "").split(",") if env.get(memory_var) else []
        for i, gpu in enumerate(gpus):
            held[gpu] = held.get(gpu, 0) + (int(shares[i]) if i < len(shares) else capacity_mib)
    return sum(1 for mib in held.values() if mib > capacity_mib)


def kill_all(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run_seconds(pid: int) -> dict[int, float]:
    """Per thread of `pid`, the CPU time it has run, in nanoseconds' resolution
    (/proc/PID/task/TID/schedstat): /proc/PID/stat counts in clock ticks of
    10 ms, which over a 10 s window tell 0.2% from 0.3% of a core by one tick."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9
        except (OSError, IndexError, ValueError):
            continue
    return out


def idle_cost(pid: int, window_s: float) -> tuple[float, float]:
    """(RSS MiB, CPU percent of one core) over `window_s` seconds of doing nothing.

    Summed over the threads' run times where the same threads lived through the
    window; where one ended meanwhile (its time would be lost), from the ticks."""
    before, ticks = run_seconds(pid), cpu_seconds(pid)
    time.sleep(window_s)
    after, ticks = run_seconds(pid), cpu_seconds(pid) - ticks
    used = sum(after.values()) - sum(before.values()) if before.keys() == after.keys() else ticks
    return rss_mib(pid), used / window_s * 100


def ok(cgd: Cgd, method: str, path: str, body: Any = None, expect: int = 200) -> Any:
    """One request that must succeed: a benchmark on a refusing daemon measures nothing."""
    status, reply = cgd.request(method, path, body)
    if status != expect:
        raise RuntimeError(f"{method} {path} answered {status}: {reply}")
    return reply


def replica_pids(cgd: Cgd) -> dict[str, list[int]]:
    """`component/replica` -> the pids cgd reports for it."""
    components = ok(cgd, "GET", "/v1/components")["components"]
    return {f"{c['name']}/{r['index']}": list(r["pids"]) for c in components for r in c["replicas"]}


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
