"""cgd's own MPS control daemon, so GPU shares are enforced by the driver.

Under MPS the driver caps each client's device memory
(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT) and its share of SMs
(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE); daemon/workerenv.py sets those per
worker. cgd runs its own control daemon with its own pipe directory, so it
never depends on, or disturbs, one an administrator runs in /tmp/nvidia-mps;
only workers given that pipe directory are MPS clients.

Limits of MPS to know about: one MPS server serves one uid at a time, so
workers of different users on one GPU take turns rather than run
concurrently; and a control daemon left by a cgd that died keeps running
and is reused (its pid file says so).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from computegroups.daemon.supervision.workerenv import MpsSettings

BINARY = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"
_TIMEOUT_S = 30.0


class MpsError(RuntimeError):
    """MPS is enabled but can not be started or stopped; the message says why."""


class MpsControl:
    """Start and stop `nvidia-cuda-mps-control` for one pipe directory.

    Blocking (it waits for the control program): call it at start-up and
    shutdown, or from a thread.
    """

    def __init__(self, pipe_dir: str | os.PathLike[str], log_dir: str | os.PathLike[str]) -> None:
        self.pipe_dir = Path(pipe_dir)
        self.log_dir = Path(log_dir)

    @property
    def settings(self) -> MpsSettings:
        return MpsSettings(pipe_directory=str(self.pipe_dir))

    @staticmethod
    def available() -> bool:
        return shutil.which(BINARY) is not None

    def running(self) -> bool:
        """True if a control daemon already serves this pipe directory."""
        try:
            pid = int((self.pipe_dir / PID_FILE).read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return False
        return True

    def start(self) -> bool:
        """Start the control daemon unless one already serves this pipe
        directory; True if this call started it."""
        binary = self._binary()
        if self.running():
            return False
        self.pipe_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.log_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        self._run([binary, "-d"], stdin=None)
        return True

    def stop(self) -> None:
        """Ask the control daemon to quit; MPS servers exit once their
        clients are gone. Do not call it when workers are left running for
        the next cgd (--keep-workers): they are still MPS clients."""
        if not self.running():
            return
        self._run([self._binary()], stdin="quit\n")

    def command_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(self.pipe_dir)
        env["CUDA_MPS_LOG_DIRECTORY"] = str(self.log_dir)
        return env

    def _binary(self) -> str:
        found = shutil.which(BINARY)
        if found is None:
            raise MpsError(
                f"shares.mps is enabled but {BINARY} is not on PATH; install the NVIDIA "
                "driver utilities (nvidia-utils / nvidia-compute-utils) or set shares.mps = false"
            )
        return found

    def _run(self, argv: list[str], stdin: str | None) -> None:
        """Output goes to a file, not a pipe: `-d` forks a daemon that could
        hold a pipe open and make us wait for it."""
        with tempfile.TemporaryFile() as output:
            try:
                done = subprocess.run(
                    argv, input=stdin.encode() if stdin is not None else None,
                    stdin=subprocess.DEVNULL if stdin is None else None,
                    stdout=output, stderr=output, env=self.command_env(), timeout=_TIMEOUT_S,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise MpsError(f"{' '.join(argv)}: {exc}") from None
            if done.returncode != 0:
                output.seek(0)
                detail = output.read(4096).decode(errors="replace").strip()
                raise MpsError(f"{' '.join(argv)} exited with {done.returncode}: {detail}")
