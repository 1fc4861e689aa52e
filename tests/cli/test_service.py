"""`cgctl install-service`: the unit text and where it goes; systemctl is never run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from computegroups.cli.main import cli
from computegroups.cli.service import find_cgd, unit_text


def test_print_shows_a_system_unit_running_the_installed_cgd(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["install-service", "--print"])
    assert result.exit_code == 0
    assert f"ExecStart={find_cgd()} $CGD_OPTS\n" in result.stdout
    assert "WantedBy=multi-user.target" in result.stdout and "RuntimeDirectory=computegroups" in result.stdout


def test_user_unit_is_written_under_xdg_config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    result = CliRunner().invoke(cli, ["install-service", "--user"])
    unit = tmp_path / "systemd" / "user" / "computegroups.service"
    assert result.exit_code == 0
    assert "WantedBy=default.target" in unit.read_text()
    assert "systemctl --user daemon-reload" in result.stdout
    assert "systemctl --user enable --now computegroups" in result.stdout
    assert "loginctl enable-linger" in result.stdout


def test_json_says_where_and_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    doc = json.loads(CliRunner().invoke(cli, ["--json", "install-service", "--user"]).stdout)
    assert doc == {"path": str(tmp_path / "systemd" / "user" / "computegroups.service"), "user": True,
                   "started": False,
                   "commands": ["systemctl --user daemon-reload", "systemctl --user enable --now computegroups"]}


def test_unwritable_place_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: Path, text: str) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.setattr(Path, "write_text", refuse)
    result = CliRunner().invoke(cli, ["install-service", "--user"])
    assert result.exit_code == 1
    assert result.stderr.startswith("cgctl: error: cannot write ") and "use --user" in result.stderr


@pytest.mark.parametrize("user, contrib", [(False, "computegroups.service"), (True, "computegroups-user.service")])
def test_units_are_contribs_with_the_installed_cgd(user: bool, contrib: str) -> None:
    """The units shipped in contrib/ and the ones cgctl writes must not drift."""
    lines = (Path(__file__).resolve().parents[2] / "contrib" / contrib).read_text().splitlines(keepends=True)
    while lines and (lines[0].startswith("#") or not lines[0].strip()):
        lines.pop(0)
    expected = "".join("ExecStart=/opt/cg/bin/cgd $CGD_OPTS\n" if line.startswith("ExecStart=") else line
                       for line in lines)
    assert unit_text(user, "/opt/cg/bin/cgd") == expected
