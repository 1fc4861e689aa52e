"""MPS control without a GPU: the missing binary, and the exact commands run
(through a stand-in `nvidia-cuda-mps-control` that records what it gets)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from computegroups.daemon.supervision.mps import PID_FILE, MpsControl, MpsError

FAKE = """#!{python}
import json, os, sys
record = {{"argv": sys.argv[1:], "stdin": "" if sys.argv[1:] == ["-d"] else sys.stdin.read(),
          "pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"), "log": os.environ.get("CUDA_MPS_LOG_DIRECTORY")}}
with open(os.environ["FAKE_MPS_RECORD"], "a") as fh:
    fh.write(json.dumps(record) + "\\n")
if sys.argv[1:] == ["-d"]:
    open(os.path.join(os.environ["CUDA_MPS_PIPE_DIRECTORY"], "{pid_file}"), "w").write(str(os.getppid()))
sys.exit(int(os.environ.get("FAKE_MPS_EXIT", "0")))
"""


@pytest.fixture
def fake_mps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(FAKE.format(python=sys.executable, pid_file=PID_FILE))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_MPS_RECORD", str(record))
    return record


def calls(record: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in record.read_text().splitlines()]


def test_missing_binary_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    control = MpsControl(tmp_path / "pipe", tmp_path / "log")
    assert not control.available()
    with pytest.raises(MpsError, match=r"nvidia-cuda-mps-control is not on PATH.*shares\.mps = false"):
        control.start()
    assert not (tmp_path / "pipe").exists()


def test_start_and_stop_run_the_documented_commands(fake_mps: Path, tmp_path: Path) -> None:
    control = MpsControl(tmp_path / "pipe", tmp_path / "log")
    assert control.available() and not control.running()
    assert control.settings.pipe_directory == str(tmp_path / "pipe")
    assert control.start()
    assert control.running()
    assert not control.start()
    control.stop()
    pipe, log = str(tmp_path / "pipe"), str(tmp_path / "log")
    assert calls(fake_mps) == [
        {"argv": ["-d"], "stdin": "", "pipe": pipe, "log": log},
        {"argv": [], "stdin": "quit\n", "pipe": pipe, "log": log},
    ]
    assert (tmp_path / "log").is_dir()


def test_a_failing_control_program_is_reported(fake_mps: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MPS_EXIT", "3")
    with pytest.raises(MpsError, match="exited with 3"):
        MpsControl(tmp_path / "pipe", tmp_path / "log").start()


def test_stop_without_a_daemon_does_nothing(fake_mps: Path, tmp_path: Path) -> None:
    MpsControl(tmp_path / "pipe", tmp_path / "log").stop()
    assert not fake_mps.exists()
    assert os.environ.get("CUDA_MPS_PIPE_DIRECTORY") is None
