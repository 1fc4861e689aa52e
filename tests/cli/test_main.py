"""Usage mistakes get one line and exit 2, through the installed executable."""

from __future__ import annotations

import subprocess

import pytest

from tests.daemon_fixture import _executable


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["allocate"], "cgctl: error: Missing argument 'NAME'."),
        (["allocate", "x", "--gpus", "two"], "cgctl: error: Invalid value for '--gpus'"),
        (["allocate", "x", "--memory", "20XB"], "not a size: '20XB'"),
        (["no-such-command"], "cgctl: error: No such command 'no-such-command'"),
        (["allocate", "Bad_Name", "--gpus", "1"], "Invalid value for 'NAME': 'Bad_Name' is not a valid name"),
        (["restart", "web.1"], "Invalid value for 'NAME': 'web.1' is not a valid name"),
    ],
)
def test_usage_errors_are_one_line(args: list[str], expected: str) -> None:
    done = subprocess.run([_executable("cgctl"), *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], done.stderr


def test_help_still_exits_zero() -> None:
    done = subprocess.run([_executable("cgctl"), "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "allocate" in done.stdout

