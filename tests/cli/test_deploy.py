"""`cgctl apply/delete/get` and the deployment scale helper, with the socket
exchange replaced: which requests go out, what is printed, which exit code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from computegroups.cli.context import CliContext
from computegroups.cli.deploy import apply, delete, deployment_json, get, scale_deployment
from computegroups.daemon.client.errors import CgdError
from tests.cli.fake_cgd import FakeCgd, install

FILE = """
name = "rs"
[[claims]]
name = "kv"
memory = "2GiB"
[[components]]
name = "w"
command = ["sleep", "60"]
sharing = [{ claim = "kv", scope = "per-replica" }]
"""

DEVICE = {"index": 0, "uuid": "GPU-0", "mig_uuid": None, "memory_mib": 2048, "compute_pct": 0, "whole": False}


def tree(**extra: Any) -> dict[str, Any]:
    replica = {"index": 0, "role": "primary", "state": "running", "restarts": 0, "promotions": 0,
               "groups": ["rs-0-w-0-kv"], "devices": [DEVICE], "cuda_visible_devices": "0", "pids": [42]}
    component = {"name": "w", "path": "rs-0-w", "state": "running", "shadow_of": None, "replicas_wanted": 1,
                 "groups": ["rs-0-w-0-kv"], "replicas": [replica]}
    return {
        "name": "rs", "owner": {"uid": 1000, "gid": 1000, "user": "ada"}, "source": "/srv/rs.toml",
        "replicas_wanted": 1, "claims": {"kv": {"memory": 2048}}, "set_groups": [],
        "groups": [{"id": "rs-0-w-0-kv", "claim": "kv", "owner": "rs-0-w", "scope": "per-replica", "replica": 0,
                    "state": "allocated", "users": ["rs-0-w/0"], "devices": [DEVICE]}],
        "replicas": [{"index": 0, "groups": [], "components": [component], "scaling_groups": []}],
        **extra,
    }


CHANGES = {"created": True, "groups_created": ["rs-0-w-0-kv"], "groups_deleted": [],
           "components_created": ["rs-0-w"], "components_deleted": [], "workers_started": ["rs-0-w/0"],
           "workers_stopped": []}


@pytest.fixture
def cgd(monkeypatch: pytest.MonkeyPatch) -> FakeCgd:
    return install(monkeypatch)


def run(command: click.Command, *args: str, json_output: bool = False) -> Result:
    return CliRunner().invoke(command, list(args), obj=CliContext(json=json_output))


def test_apply_sends_the_file_and_its_absolute_path(cgd: FakeCgd, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rs.toml").write_text(FILE)
    monkeypatch.chdir(tmp_path)
    cgd.on("POST", "/v1/deployments", tree(changes=CHANGES))
    result = run(apply, "-f", "rs.toml")
    assert result.exit_code == 0, result.output
    (method, path, body), = cgd.sent()
    assert (method, path) == ("POST", "/v1/deployments")
    assert body["source"] == str(tmp_path / "rs.toml")
    assert body["spec"]["claims"] == [{"name": "kv", "memory": "2GiB"}]
    assert result.stdout.splitlines()[0] == "deployment rs created: 1 groups, 1 workers"
    assert "  groups created: rs-0-w-0-kv" in result.stdout


def test_apply_json_has_stable_keys(cgd: FakeCgd, tmp_path: Path) -> None:
    (tmp_path / "rs.toml").write_text(FILE)
    cgd.on("POST", "/v1/deployments", tree(changes=CHANGES, extra_key=1))
    doc = json.loads(run(apply, "-f", str(tmp_path / "rs.toml"), json_output=True).stdout)
    assert set(doc) == {"name", "owner", "source", "replicas_wanted", "claims", "set_groups", "groups",
                        "replicas", "changes"}
    assert doc["replicas"][0]["components"][0]["replicas"][0]["groups"] == ["rs-0-w-0-kv"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name = ", "not valid TOML"),
        ("name = 'rs'\nwhen = 2026-01-01", "when: dates and times are not allowed"),
    ],
)
def test_a_file_cgctl_cannot_read_fails_before_asking_cgd(cgd: FakeCgd, tmp_path: Path, text: str,
                                                          message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    result = run(apply, "-f", str(path))
    assert result.exit_code == 1 and f"cgctl: error: {path}: {message}" in result.output
    assert not cgd.sent()


def test_cgd_s_refusal_is_one_line(cgd: FakeCgd, tmp_path: Path) -> None:
    (tmp_path / "rs.toml").write_text(FILE)
    cgd.on("POST", "/v1/deployments", CgdError(409, "conflict", "rs.toml: field is immutable: claims[0].memory"))
    result = run(apply, "-f", str(tmp_path / "rs.toml"))
    assert result.exit_code == 1
    assert result.output == "cgctl: error: rs.toml: field is immutable: claims[0].memory\n"


def test_delete_by_name_or_by_file(cgd: FakeCgd, tmp_path: Path) -> None:
    (tmp_path / "rs.toml").write_text(FILE)
    cgd.on("DELETE", "/v1/deployments/rs", {"deleted": "rs", "components": ["rs-0-w"], "groups": ["rs-0-w-0-kv"],
                                            "workers": ["rs-0-w/0"]})
    assert run(delete, "rs").stdout == "deleted rs: 1 components, 1 groups, 1 workers stopped\n"
    assert run(delete, "-f", str(tmp_path / "rs.toml")).exit_code == 0
    assert [p for _, p, _ in cgd.sent()] == ["/v1/deployments/rs"] * 2
    assert run(delete).exit_code == 2
    assert run(delete, "rs", "-f", str(tmp_path / "rs.toml")).exit_code == 2


def test_get_prints_the_tree_and_lists_without_a_name(cgd: FakeCgd) -> None:
    cgd.on("GET", "/v1/deployments/rs", tree())
    cgd.on("GET", "/v1/deployments", {"deployments": [{"name": "rs", "owner": {"user": "ada"},
                                                       "source": "/srv/rs.toml", "replicas_wanted": 1,
                                                       "components": 1, "groups": 1, "workers": 1}]})
    text = run(get, "rs").stdout
    assert text.splitlines()[0] == "deployment rs  1 replica  owner ada  file /srv/rs.toml"
    assert "    component w (rs-0-w)  1 replica  running  groups: rs-0-w-0-kv" in text
    assert "      0  primary  running  pids 42  GPU 0[2GiB/0%]  groups: rs-0-w-0-kv" in text
    assert json.loads(run(get, "rs", json_output=True).stdout) == deployment_json(tree())
    assert run(get).stdout.splitlines()[1].split() == ["rs", "1", "1", "1", "1", "ada", "/srv/rs.toml"]


def test_scale_deployment_addresses_the_set_a_group_or_a_component(cgd: FakeCgd) -> None:
    cgd.on("POST", "/v1/deployments/rs/scale", tree())
    scale_deployment(cgd, "rs", 2)
    scale_deployment(cgd, "rs/sga", 3)
    assert [b for _, _, b in cgd.sent()] == [{"target": None, "replicas": 2}, {"target": "sga", "replicas": 3}]


def many_groups_tree() -> dict[str, Any]:
    """Twelve replicas of a component of a long name, from a file deep in a home directory."""
    long = "a-very-long-component-name-for-the-inference-server"
    ids = [f"{long}-{i}-kv-cache-shared" for i in range(12)]
    replicas = [{"index": i, "role": "primary", "state": "running", "restarts": 0, "promotions": 0,
                 "groups": [ids[i]], "devices": [DEVICE], "cuda_visible_devices": "0",
                 "pids": [100000 + i, 200000 + i]} for i in range(12)]
    component = {"name": long, "path": f"rs-0-{long}", "state": "running", "shadow_of": None,
                 "replicas_wanted": 12, "groups": ids, "replicas": replicas}
    return tree(
        source="/home/somebody-with-a-long-name/projects/inference/deployments/production-large.toml",
        groups=[{"id": g, "claim": "kv-cache-shared", "owner": f"rs-0-{long}", "scope": "per-replica",
                 "replica": 0, "state": "allocated", "users": [f"rs-0-{long}/0"], "devices": [DEVICE]}
                for g in ids],
        replicas=[{"index": 0, "groups": ids, "components": [component], "scaling_groups": []}],
        changes={**CHANGES, "groups_created": ids})


def test_get_apply_and_scale_text_fit_80_columns() -> None:
    from computegroups.cli.deploy import change_text, list_text, tree_text

    d = many_groups_tree()
    listed = {"name": "a-deployment-with-a-rather-long-name", "replicas_wanted": 12, "components": 1,
              "groups": 12, "workers": 12, "owner": {"user": "somebody-with-a-long-name"}, "source": d["source"]}
    for lines in (change_text(d, "created"), tree_text(d), list_text([listed])):
        assert lines and max(len(line) for line in lines) <= 80, "\n".join(lines)
    created = change_text(d, "created")
    assert " ".join(line.strip() for line in created).count("-kv-cache-shared") == 12  # wrapped, none lost
    row = list_text([listed])[1]
    assert "/home" in row and row.endswith(".toml")  # a path shortened keeps its start and its end
    assert max(len(line) for line in tree_text(d, 50)) <= 50
