"""`cgctl group`'s text, from group documents shaped like docs/api.md."""

from __future__ import annotations

from typing import Any

from computegroups.cli.groups import groups_text


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
