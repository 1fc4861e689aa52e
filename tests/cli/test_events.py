"""`cgctl events` as text: one line per event, as wide as the terminal."""

from __future__ import annotations

from click.testing import CliRunner

from computegroups.cli.events import event_line
from computegroups.cli.main import cli

LONG = {"seq": 1000000042, "time": 0, "type": "worker_exited", "user": "alice",
        "message": "train/0 (pid 812) ended: signal SIGKILL; its shadow train-standby/0 takes over on GPUs 0-7 "
                   "(group train-0), as the component asked"}


def test_a_line_is_cut_at_the_width_it_is_given() -> None:
    at80 = event_line(LONG)
    assert len(at80) == 80 and at80.endswith("...")
    at160 = event_line(LONG, 160)
    assert at160.endswith("as the component asked") and len(at160) <= 160
    assert event_line(LONG, 160)[:77] == at80[:77]


def test_help_says_json() -> None:
    result = CliRunner().invoke(cli, ["events", "--help"], prog_name="cgctl")
    assert result.exit_code == 0
    options = result.output[result.output.index("Options:"):]
    assert "--json" in options and "One JSON object per line" in options
