"""Every cgd-facing command through the real click parsing, with the socket
exchange replaced: which requests go out, what is printed, which exit code."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner, Result

from computegroups.cli.main import cli
from computegroups.cli.status_view import Board, status_json
from computegroups.daemon.client.errors import CgdError
from tests.cli.fake_cgd import FakeCgd, install
from tests.cli.samples import busy_machine, component, measured


@pytest.fixture
def cgd(monkeypatch: pytest.MonkeyPatch) -> FakeCgd:
    return install(monkeypatch)


def cgctl(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), prog_name="cgctl")


def test_allocate_sends_every_flag(cgd: FakeCgd) -> None:
    cgd.on("POST", "/v1/components", component())
    result = cgctl("allocate", "web", "--gpus", "2", "--replicas", "2", "--strategy", "spread",
                   "--colocate", "nvlink", "--distinct", "--pool", "fast", "--gpu-ids", "0,1,2,3",
                   "--priority", "3", "--allow-busy", "--affinity", "db:numa", "--anti-affinity", "web2",
                   "--scope", "per-replica", "--env", "A=1", "--env", "B=x y",
                   "--", "python", "-m", "serve", "--port", "80")
    assert result.exit_code == 0, result.output
    (method, path, body), = cgd.sent()
    assert (method, path) == ("POST", "/v1/components")
    assert body == {
        "name": "web", "replicas": 2, "scope": "per-replica",
        "claim": {"gpus": 2, "strategy": "spread", "colocate": "nvlink", "distinct": True, "pool": "fast",
                  "gpu_ids": [0, 1, 2, 3], "priority": 3, "allow_busy": True,
                  "affinity": [{"component": "db", "level": "numa"}],
                  "anti_affinity": [{"component": "web2", "level": "device"}]},
        "env": {"PATH": os.environ["PATH"], "A": "1", "B": "x y"},
        "command": ["python", "-m", "serve", "--port", "80"], "cwd": os.getcwd(),
    }
    assert result.stdout.startswith("started web: 2 replicas")


def test_allocate_json_has_the_issue_shape(cgd: FakeCgd) -> None:
    cgd.on("POST", "/v1/components", component())
    result = cgctl("--json", "allocate", "web", "--memory", "20GiB", "--compute", "30")
    doc = json.loads(result.stdout)
    assert cgd.sent()[0][2]["claim"] == {"memory_mib": 20480, "compute_pct": 30}
    assert doc["name"] == "web"
    for replica in doc["replicas"]:
        assert {"index", "group", "role", "devices", "cuda_visible_devices", "pids"} <= set(replica)
        for device in replica["devices"]:
            assert {"index", "uuid", "memory_mib", "compute_pct"} <= set(device)


def test_colocate_takes_every_domain_the_api_takes(cgd: FakeCgd) -> None:
    cgd.on("POST", "/v1/components", component())
    for domain in ("nvlink", "pcie", "numa", "machine", "none"):
        assert cgctl("allocate", "web", "--gpus", "2", "--colocate", domain).exit_code == 0
    assert [body["claim"]["colocate"] for _, _, body in cgd.sent("POST")] == [
        "nvlink", "pcie", "numa", "machine", "none"]


def test_allocate_explain(cgd: FakeCgd) -> None:
    cgd.on("POST", "/v1/components", component())
    assert "why: GPU 0: emptiest NVLink island" in cgctl("allocate", "web", "--gpus", "1", "--explain").stdout


def test_allocate_without_size_takes_the_reservation(cgd: FakeCgd) -> None:
    cgd.on("GET", "/v1/reservations", {"reservations": [{"name": "web"}]})
    cgd.on("POST", "/v1/components", component())
    assert cgctl("allocate", "web").exit_code == 0
    assert cgd.sent("POST")[0][2] == {"name": "web"}


def test_allocate_without_size_or_reservation_is_a_usage_error(cgd: FakeCgd) -> None:
    cgd.on("GET", "/v1/reservations", {"reservations": []})
    cgd.on("GET", "/v1/version", {"machine": {"gpus": 8}})
    result = cgctl("allocate", "web")
    assert result.exit_code == 2
    assert "--gpus N, --memory SIZE, --mig PROFILE or --cpus N" in result.stderr
    assert cgd.sent("POST") == []


def test_allocate_without_size_on_a_machine_without_gpus_runs_cpu_only(cgd: FakeCgd) -> None:
    cgd.on("GET", "/v1/reservations", {"reservations": []})
    cgd.on("GET", "/v1/version", {"machine": {"gpus": 0}})
    cgd.on("POST", "/v1/components", component())
    assert cgctl("allocate", "web").exit_code == 0
    assert cgd.sent("POST")[0][2] == {"name": "web"}


@pytest.mark.parametrize("args", [
    ["allocate", "web", "--memory", "20Q"],
    ["allocate", "web", "--gpus", "0"],
    ["allocate", "web", "--gpus", "1", "--mig", "1g.10gb"],
    ["allocate", "web", "--share-with", "db", "--gpus", "1"],
    ["allocate", "web", "--gpus", "1", "--env", "NOEQUALS"],
    ["reserve", "web", "--gpus", "1", "--ttl", "soon"],
    ["allocate", "web", "--gpus", "1", "--compute-capability", "9"],
    ["allocate", "web", "--gpus", "1", "--compute-capability", "abc"],
    ["allocate", "web", "--gpus", "1", "--priority", "5000"],
    ["allocate", "web", "--gpus", "2", "--gpu-ids", "3"],
    ["allocate", "web", "--gpus", "1", "--share", "whole"],
    ["reserve", "web", "--cpus", "2", "--priority", "-1001", "--ttl", "1h"],
    ["group", "create", "--gpus", "1", "--priority", "5000"],
    ["events", "--since", "-1"],
    ["events", "--since", "5"],
    ["release"],
    ["release", "web", "--all"],
    ["scale", "web"],
    ["drain", "x"],
])
def test_usage_errors_exit_2_and_send_nothing(cgd: FakeCgd, args: list[str]) -> None:
    assert cgctl(*args).exit_code == 2
    assert cgd.requests == []


def test_refusal_is_one_line_and_exit_1(cgd: FakeCgd) -> None:
    cgd.on("POST", "/v1/components", CgdError(409, "insufficient_capacity", "needs 2 free GPUs, 1 is free"))
    result = cgctl("allocate", "web", "--gpus", "2")
    assert result.exit_code == 1
    assert result.stderr == "cgctl: error: needs 2 free GPUs, 1 is free\n"
    assert result.stdout == ""


def test_release_names_go_in_one_request(cgd: FakeCgd) -> None:
    cgd.on("DELETE", "/v1/components?name=web&name=train",
           {"released": ["web"], "groups": ["train-0", "web-0"], "reservations": ["train"]})
    assert cgctl("release", "web", "train", "web").stdout == "released web, train (groups train-0, web-0)\n"
    assert cgd.sent() == [("GET", "/v1/components/web", None), ("GET", "/v1/components/train", None),
                          ("DELETE", "/v1/components?name=web&name=train", None)]


def test_release_of_many_groups_wraps_within_80_columns() -> None:
    from computegroups.cli.release import release_text

    groups = [f"a-component-with-a-long-name-{i}" for i in range(12)]
    lines = release_text({"released": ["a-component-with-a-long-name"], "groups": groups, "reservations": []}, 80)
    assert len(lines) > 1 and max(len(line) for line in lines) <= 80
    assert " ".join(lines).count("a-component-with-a-long-name-") == 12


def test_release_of_nothing_by_that_name_is_cgds_one_line(cgd: FakeCgd) -> None:
    cgd.on("DELETE", "/v1/components?name=x",
           CgdError(404, "not_found", "no component or reservation named 'x': nothing released"))
    result = cgctl("release", "x")
    assert result.exit_code == 1
    assert result.stderr == "cgctl: error: no component or reservation named 'x': nothing released\n"


def test_release_all_takes_own_reservations_too(cgd: FakeCgd) -> None:
    cgd.on("DELETE", "/v1/components?all=true", {"released": ["a", "b"], "groups": ["a-0", "b-0"]})
    cgd.on("GET", "/v1/reservations", {"reservations": [
        {"name": "mine", "owner": {"uid": os.getuid()}}, {"name": "theirs", "owner": {"uid": os.getuid() + 1}}]})
    cgd.on("DELETE", "/v1/reservations/mine", {"released": "mine", "groups": ["mine-0"]})
    result = cgctl("--json", "release", "--all")
    assert json.loads(result.stdout) == {"released": ["a", "b"], "groups": ["a-0", "b-0", "mine-0"],
                                         "reservations": ["mine"]}
    assert ("DELETE", "/v1/reservations/theirs", None) not in cgd.sent()


def test_scale(cgd: FakeCgd) -> None:
    cgd.on("GET", "/v1/deployments", {"deployments": []})
    cgd.on("POST", "/v1/components/web/scale", component(replicas=3))
    result = cgctl("scale", "web", "--replicas", "3")
    assert cgd.sent()[-1] == ("POST", "/v1/components/web/scale", {"replicas": 3})
    assert result.stdout.startswith("scaled web: 3 replicas")


def test_list_table_and_json(cgd: FakeCgd) -> None:
    cgd.on("GET", "/v1/components", {"components": [component()]})
    cgd.on("GET", "/v1/reservations", {"reservations": []})
    assert cgctl("list").stdout.splitlines()[1].split()[:3] == ["web", "0", "web-0"]
    doc = json.loads(cgctl("--json", "list").stdout)
    assert doc["components"][0]["replicas"][1]["pids"] == [4243] and doc["reservations"] == []


def test_list_mine_asks_for_the_callers_uid(cgd: FakeCgd) -> None:
    cgd.on("GET", "/v1/components", {"components": []})
    cgd.on("GET", "/v1/reservations", {"reservations": []})
    cgctl("list", "--mine")
    assert cgd.sent()[0][1] == f"/v1/components?owner={os.getuid()}"


def test_status_text_long_and_json(cgd: FakeCgd, monkeypatch: pytest.MonkeyPatch) -> None:
    doc, components, reservations = busy_machine()
    sampled = measured()["sampled_at"]
    monkeypatch.setattr("computegroups.cli.status.time", SimpleNamespace(time=lambda: sampled + 5))
    cgd.on("GET", "/v1/status", doc)
    cgd.on("GET", "/v1/components", {"components": components})
    cgd.on("GET", "/v1/reservations", {"reservations": reservations})
    cgd.on("GET", "/v1/health", {"status": "ok", "last_sample": sampled, "interval_s": 2.0})
    cgd.on("GET", "/v1/groups", {"groups": []})
    text = cgctl("status").stdout
    assert "\x1b[" not in text  # not a terminal
    assert text.splitlines()[1].endswith("ada/web:run ada/web-sb:shadow") and "bob/later:reserved" in text
    assert cgctl("status", "--watch").stdout == text and cgctl("top").stdout == text  # no terminal: once
    assert json.loads(cgctl("--json", "status").stdout) == status_json(
        Board.of(doc, components, reservations, now=sampled + 5, stale_after_s=6.0))
    assert "stale" not in text and " 87% " in text.splitlines()[1]  # 5 s old: fresh for a loop of 2 s
    cgd.on("GET", "/v1/health", {"status": "ok", "last_sample": sampled, "interval_s": 1.0})
    assert "  ! stale: GPU 0,1,3,4,5,7 last measured 5s ago" in cgctl("status").stdout.splitlines()
    cgd.on("GET", "/v1/health", {"status": "ok", "last_sample": sampled})  # a cgd that does not say: 10 s
    assert cgctl("status").stdout == text
    long = cgctl("status", "--long").stdout
    assert "\x1b[" not in long and all(len(line) <= 80 for line in long.splitlines())
    assert "  on it: ada/web:run (exclusive), ada/web-sb:shadow" in long and "bob/later:reserved" in long
    # one JSON for every layout: the projection of the one look both draw
    assert cgctl("--json", "status", "--long").stdout == cgctl("--json", "status").stdout


def test_env_prints_shell_lines(cgd: FakeCgd) -> None:
    cgd.on("GET", "/v1/components/web/env", {"name": "web", "replica": 1,
                                              "env": {"CUDA_VISIBLE_DEVICES": "1", "X": "a b'c"}})
    result = cgctl("env", "web", "--replica", "1")
    assert cgd.sent()[0][1] == "/v1/components/web/env?replica=1"
    assert result.stdout == "export CUDA_VISIBLE_DEVICES=1\nexport X='a b'\"'\"'c'\n"


def test_drain_and_undrain(cgd: FakeCgd) -> None:
    cgd.on("POST", "/v1/gpus/3/drain", {"gpu": 3, "drained": True, "groups": ["web-0"]})
    cgd.on("POST", "/v1/gpus/3/undrain", {"gpu": 3, "drained": False, "groups": ["web-0"]})
    assert "GPU 3 drained" in cgctl("drain", "3").stdout
    assert "GPU 3 undrained" in cgctl("drain", "3", "--undrain").stdout


def test_reserve(cgd: FakeCgd) -> None:
    cgd.on("POST", "/v1/reservations", {"name": "train", "owner": {"uid": 0}, "expires_at": 2e9, "priority": 0,
                                        "groups": [{"id": "train-0", "devices": [{"index": 4, "whole": True}]}]})
    result = cgctl("reserve", "train", "--gpus", "1", "--ttl", "1h")
    assert cgd.sent() == [("POST", "/v1/reservations",
                           {"name": "train", "claim": {"gpus": 1}, "replicas": 1, "ttl_s": 3600.0})]
    assert result.stdout.startswith("reserved train: 1 group on GPU 4 until ")
    assert result.stdout.splitlines()[1:] == ["take it:  cgctl allocate train -- CMD", "free it:  cgctl release train"]


def test_reserve_and_drain_fit_80_columns_with_long_names(cgd: FakeCgd) -> None:
    name = "a-rather-long-reservation-name-for-the-team"
    cgd.on("POST", "/v1/reservations", {"name": name, "owner": {"uid": 0}, "expires_at": 2e9, "priority": 0,
                                        "groups": [{"id": f"{name}-0", "devices": [{"index": 1, "whole": True}]}]})
    cgd.on("POST", "/v1/gpus/1/drain", {"gpu": 1, "drained": True, "groups": [f"{name}-0", f"{name}-1"]})
    outputs = [cgctl(*args).stdout.splitlines() for args in (("reserve", name, "--gpus", "1"), ("drain", "1"))]
    for lines in outputs:
        assert len(lines) > 1 and max(len(line) for line in lines) <= 80, lines
    assert f"take it:  cgctl allocate {name} -- CMD" in outputs[0]
    assert f"{name}-1 (release or move them)" in " ".join(outputs[1])


def test_logs_once_and_followed_until_released(cgd: FakeCgd, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("computegroups.cli.logs.POLL_S", 0)
    reads = iter([{"path": "p", "offset": 6, "size": 6, "data": "hello\n"},
                  {"path": "p", "offset": 12, "size": 12, "data": "world\n"},
                  CgdError(404, "not_found", "no component named 'web'")])

    def answer(request: object) -> object:
        item = next(reads)
        if isinstance(item, CgdError):
            raise item
        return item

    cgd.on("GET", "/v1/components/web/logs", answer)
    result = cgctl("logs", "web", "-f", "--stream", "stderr", "--tail", "5")
    assert result.exit_code == 0
    assert result.stdout == "hello\nworld\n"
    assert [p for _, p, _ in cgd.sent()] == [
        "/v1/components/web/logs?replica=0&stream=stderr&tail=5",
        "/v1/components/web/logs?replica=0&stream=stderr&offset=6",
        "/v1/components/web/logs?replica=0&stream=stderr&offset=12",
    ]
    assert "web is gone" in result.stderr


def test_daemon_down_for_every_command(tmp_path: Path) -> None:
    missing = tmp_path / "cgd.sock"
    for args in (["list"], ["status"], ["allocate", "web", "--gpus", "1"], ["release", "web"],
                 ["scale", "web", "--replicas", "2"], ["env", "web"], ["logs", "web"], ["drain", "1"],
                 ["reserve", "web", "--gpus", "1"], ["run", "--gpus", "1", "--", "true"]):
        result = cgctl("--socket", str(missing), *args)
        assert result.exit_code == 1, args
        assert result.stderr == (f"cgctl: error: cgd is not running (no socket at {missing}): "
                                 "start it with `cgd` or `systemctl start computegroups`\n"), args


def test_options_that_mean_nothing_together_are_refused(cgd: FakeCgd) -> None:
    for args, message in ((("status", "--interval", "2"), "give --watch too"),
                          (("release", "--all", "web"), "or give --all, not both")):
        result = cgctl(*args)
        assert result.exit_code == 2 and message in result.stderr, result.stderr
    assert cgd.sent() == []
