"""`cgctl group`'s text, from group documents shaped like docs/api.md."""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner

from computegroups.cli.groups import created_text, groups_text
from computegroups.cli.main import cli


def group(**extra: Any) -> dict[str, Any]:
    return {"id": "group.5", "state": "allocated", "owner": "group.5", "users": [], "claim": {"gpus": 1},
            "devices": [{"index": 0, "uuid": "GPU-0", "whole": True}], "deployment": None, **extra}


def test_a_long_user_is_shortened_in_the_middle_within_80_columns() -> None:
    long = "a-very-long-component-name-that-uses-the-group-1"
    lines = groups_text([group(owner=long, users=[f"{long}/0", f"{long.replace('1', '2')}/0", "c/0"])])
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert "..." in lines[1] and lines[1].endswith("-2 +1")


def test_a_cpu_only_group_shows_its_cpus() -> None:
    row = groups_text([group(claim={"cpus": 4}, devices=[])])[1].split()
    assert row[2:4] == ["4", "CPUs"]


def test_create_says_where_and_with_explain_why() -> None:
    why = "GPU 0: a share of 20 GiB rounded up to 40 GiB by its sharing policy (halves); " * 3
    lines = created_text(group(explanation=why), explain=True)
    assert lines[0] == "group group.5 created on GPU 0" and max(len(line) for line in lines) <= 80
    assert " ".join(lines).count("rounded up to 40 GiB") == 3
    assert not any("why" in line for line in created_text(group(explanation=why)))
    assert created_text(group(claim={"cpus": 4}, devices=[]))[0] == "group group.5 created on 4 CPUs"


def test_group_help_speaks_of_a_group_not_replicas() -> None:
    create = CliRunner().invoke(cli, ["group", "create", "--help"], prog_name="cgctl").output
    assert "Whole devices the group holds." in create and "--explain" in create
    assert "per replica" not in create.split("--compute")[0]
    listing = CliRunner().invoke(cli, ["group", "list", "--help"], prog_name="cgctl").output
    assert "Only groups in this state." in listing
