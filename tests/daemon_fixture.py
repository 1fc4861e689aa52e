"""A real cgd on a simulated machine, for end-to-end tests.

Tests talk to it the way users do: through the installed `cgctl`, or raw HTTP
on its Unix socket. Nothing here reaches into the daemon's insides.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import psutil

from computegroups.statefiles import StateStore

T = TypeVar("T")


def wait_for(check: Callable[[], T], what: str, timeout: float = 10.0, interval: float = 0.02) -> T:
    """Poll `check` until it answers something truthy, and return that.

    Tests wait for what they can observe (a file, a pid, an answer) rather
    than for a fixed time, which is both slower and flaky on a loaded box.
    """
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(interval)
    return value


def ended(pid: int) -> bool:
    """Whether `pid` has exited: gone, or a zombie not reaped yet. One look: with two (`pid_exists`,
    then `status()`), a reaping in between raises NoSuchProcess, as it did under load in CI."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 10.0) -> None:
        super().__init__("cgd", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


@dataclass
class Cgd:
    """One running daemon and the directories it owns."""

    root: Path
    machine: str
    extra_args: tuple[str, ...] = ()
    env_extra: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The daemon's pid, once `start()` has run."""
        if self.proc is None:
            raise RuntimeError("cgd was not started")
        return self.proc.pid

    @property
    def socket(self) -> Path:
        return self.root / "run" / "cgd.sock"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    def state(self) -> dict[str, Any]:
        """The state as cgd would load it (the snapshot with the journal replayed), as plain JSON data."""
        return msgspec.to_builtins(StateStore(self.state_dir).load())

    def write_state(self, data: dict[str, Any]) -> None:
        """Put `data` in place of the state, as a hand edit would: a snapshot without checksum, no journal."""
        for name in ("state.journal", "state.journal.bak"):
            (self.state_dir / name).unlink(missing_ok=True)
        data = {key: value for key, value in data.items() if key != "checksum"}
        (self.state_dir / "state.json").write_text(json.dumps(data, indent=2))

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    @property
    def faults_file(self) -> Path:
        return self.root / "faults.json"

    @property
    def stderr_path(self) -> Path:
        return self.root / "cgd.stderr"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            CG_SOCKET=str(self.socket),
            CG_SIM_FAULTS=str(self.faults_file),
            PYTHONUNBUFFERED="1",
        )
        env.pop("CG_SIMULATE", None)
        env.update(self.env_extra)
        return env

    def command(self) -> list[str]:
        return [
            _executable("cgd"),
            "--simulate", self.machine,
            "--socket", str(self.socket),
            "--state-dir", str(self.state_dir),
            "--log-dir", str(self.log_dir),
            *self.extra_args,
        ]

    def start(self, timeout: float = 20.0) -> Cgd:
        (self.root / "run").mkdir(parents=True, exist_ok=True)
        with open(self.stderr_path, "ab") as stderr:
            self.proc = subprocess.Popen(
                self.command(), env=self.env(), stdin=subprocess.DEVNULL,
                stdout=stderr, stderr=stderr, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"cgd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                status, _ = self.request("GET", "/v1/version", timeout=1.0)
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"cgd did not answer within {timeout}s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-6000:]
        except FileNotFoundError:
            return ""

    def request(
        self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
        timeout: float = 10.0,
    ) -> tuple[int, Any]:
        conn = UnixHTTPConnection(str(self.socket), timeout=timeout)
        try:
            data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
        finally:
            conn.close()
        try:
            return resp.status, json.loads(payload) if payload else None
        except ValueError:
            return resp.status, payload.decode(errors="replace")

    def cgctl(self, *args: str, timeout: float = 30.0, input: str | None = None,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        full_env = self.env()
        if env:
            full_env.update(env)
        return subprocess.run(
            [_executable("cgctl"), *args], env=full_env, capture_output=True,
            text=True, timeout=timeout, input=input,
        )

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, timeout: float = 20.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise


    def worker_pids(self) -> list[int]:
        """Every live process this daemon's workers started, whether cgd still
        runs or was killed and left them orphaned: they carry its marker."""
        marker = f"CG_INSTANCE={self.state_dir.resolve()}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if marker in environ.split(b"\0"):
                found.append(int(entry))
        return found

    def cleanup(self) -> None:
        """Stop the daemon, then kill whatever it left behind."""
        if self.proc is None:
            return
        try:
            self.stop()
        finally:
            for pid in self.worker_pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _executable(name: str) -> str:
    """Prefer the script installed beside this interpreter (the venv's)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed: run pip install -e '.[test]'")
    return found


def nvml_present() -> bool:
    """Whether this box has a working NVIDIA driver (tests of the no-driver paths skip then)."""
    from computegroups.topology.nvml import NvmlGateway, NvmlUnavailable

    try:
        with NvmlGateway() as gateway:
            gateway.start()
    except NvmlUnavailable:
        return False
    return True
