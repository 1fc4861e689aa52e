"""Usage mistakes get one line and exit 2, through the installed executable; and
what cgctl loads to start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest

from computegroups.cli.main import COMMANDS, cli
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
        (["allocate", "x", "--gpus", "1", "--priority", "5000"], "--priority: must be between -1000 and 1000"),
        (["events", "--since"], "requires an argument. (see `cgctl events --help`)"),
        (["group", "list", "--state"], "(see `cgctl group list --help`)"),
    ],
)
def test_usage_errors_are_one_line(args: list[str], expected: str) -> None:
    done = subprocess.run([_executable("cgctl"), *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], done.stderr


@pytest.mark.parametrize("args", [[], ["group"], ["render"]])
def test_a_group_named_alone_prints_its_help(args: list[str]) -> None:
    """A bare group is a question (what is there?), answered as git and kubectl do: the help on
    stdout, exit 0; never an `error:` with the hint glued to the help's last line."""
    done = subprocess.run([_executable("cgctl"), *args], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"Usage: {' '.join(['cgctl', *args])} [OPTIONS] COMMAND")
    assert "Commands:" in done.stdout and done.stderr == ""


def test_an_error_is_one_line_however_wide(tmp_path: Path) -> None:
    """docs/cli.md: an error line is never wrapped or cut, so a script reads it whole."""
    socket = tmp_path / ("a-rather-long-directory-name-" * 3) / "cgd.sock"
    done = subprocess.run([_executable("cgctl"), "--socket", str(socket), "list"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and len(lines[0]) > 80 and str(socket) in lines[0], done.stderr


def test_help_still_exits_zero() -> None:
    done = subprocess.run([_executable("cgctl"), "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "allocate" in done.stdout



def loaded_by(*args: str) -> set[str]:
    """Every module in sys.modules once the installed `cgctl ARGS` has run to its exit."""
    script = _executable("cgctl")
    code = ("import atexit, runpy, sys\n"
            "atexit.register(lambda: print(*sorted(sys.modules), sep='\\n', file=sys.stderr))\n"
            f"sys.argv = [{script!r}, *{list(args)!r}]\n"
            f"runpy.run_path({script!r}, run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return set(done.stderr.split())


def test_version_loads_no_command_nor_the_daemon_nor_metadata() -> None:
    """`cgctl --version` costs click and cgctl's own two modules: no command module, no client,
    no model (msgspec), and no importlib.metadata look-up of the installed distribution."""
    ours = sorted(m for m in loaded_by("--version") if m.startswith(("computegroups", "msgspec", "importlib.metadata")))
    assert ours == ["computegroups", "computegroups.cli", "computegroups.cli.context", "computegroups.cli.main"]


HELP_MAY_LOAD = ("computegroups.daemon.client", "computegroups.daemon.paths", "computegroups.daemon.model.names",
                 "computegroups.daemon.model.sizes")
"""What of computegroups.daemon the command modules may import to be listed: the client they talk
through, where its socket is, and the model's two standard-library rules for names and sizes."""


def test_help_loads_neither_msgspec_nor_the_daemon() -> None:
    """Listing the commands imports each command's module, but none of them pulls in msgspec or
    anything of cgd itself: what needs the model imports it when it runs."""
    loaded = loaded_by("--help")
    assert "computegroups.cli.allocate" in loaded  # the commands were listed from their modules
    assert not any(m == "msgspec" or m.startswith("msgspec.") for m in loaded)
    daemon = sorted(m for m in loaded if m.startswith("computegroups.daemon.")
                    and m != "computegroups.daemon.model"
                    and not any(m == p or m.startswith(p + ".") for p in HELP_MAY_LOAD))
    assert not daemon, f"cgctl --help loads {daemon}"


def test_every_listed_command_is_found_under_its_name() -> None:
    with click.Context(cli) as ctx:
        for name in COMMANDS:
            command = cli.get_command(ctx, name)
            assert isinstance(command, click.Command) and command.name == name, (name, command)
        assert cli.list_commands(ctx) == sorted(COMMANDS)
        assert cli.get_command(ctx, "no-such-command") is None
