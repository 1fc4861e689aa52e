"""Grove's hierarchical resource sharing end-to-end test, replayed on one box.

Seed 001's Test_RS1_HierarchicalResourceSharing, through `cgctl` against a
real cgd on the simulated dgx-h100, with docs/examples/grove-sharing.toml: a
set with a scaling group of 2 replicas and a standalone component of 1,
claims at the three levels with both scopes and every filter path. After
each step: how many groups, their exact names, and for every live worker
(its /proc environ) exactly which groups it uses and sees.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.daemon_fixture import Cgd, wait_for

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).parents[3] / "docs" / "examples" / "grove-sharing.toml"
SLEEPER = "import time\nwhile True: time.sleep(3600)"
INITIAL = [
    "rs-0-a-slot", "rs-0-set-slot", "rs-0-sga-0-rank", "rs-0-sga-0-worker-b-all-b-common", "rs-0-sga-1-rank",
    "rs-0-sga-1-worker-b-all-b-common", "rs-0-sga-all-b-cache", "rs-0-sga-all-kv", "rs-0-worker-a-0-a-rank",
    "rs-0-worker-a-all-a-common", "rs-all-set-pool", "rs-all-sga-pool",
]

Sizes = list[tuple[int, int]]
"""Per set replica: (replicas of sga, replicas of worker-a)."""


def expected_uses(sizes: Sizes) -> dict[str, list[str]]:
    """Each worker the deployment should run and the groups it should use,
    written out from the sharing table of the example (not from the plan code)."""
    uses: dict[str, list[str]] = {}
    for i, (sga, a) in enumerate(sizes):
        for k in range(a):
            groups = [f"rs-{i}-a-slot", f"rs-{i}-set-slot", f"rs-{i}-worker-a-{k}-a-rank",
                      f"rs-{i}-worker-a-all-a-common", "rs-all-set-pool"]
            uses[f"rs-{i}-worker-a/{k}"] = uses[f"rs-{i}-worker-a-standby/{k}"] = sorted(groups)
        for j in range(sga):
            common = [f"rs-{i}-set-slot", f"rs-{i}-sga-{j}-rank", f"rs-{i}-sga-all-kv", "rs-all-set-pool",
                      "rs-all-sga-pool"]
            uses[f"rs-{i}-sga-{j}-worker-b/0"] = sorted([*common, f"rs-{i}-sga-all-b-cache",
                                                               f"rs-{i}-sga-{j}-worker-b-all-b-common"])
            uses[f"rs-{i}-sga-{j}-worker-c/0"] = sorted(common)
    return uses


def cgctl(cgd: Cgd, *args: str) -> str:
    done = cgd.cgctl(*args)
    assert done.returncode == 0, (args, done.stdout, done.stderr, cgd.log())
    return done.stdout


def proc_env(pid: int) -> dict[str, str]:
    """The worker's environment once the launch shim has exec'd into it."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        env = dict(item.decode().split("=", 1) for item in raw.split(b"\0") if b"=" in item)
        if "CG_COMPONENT" in env:
            return env
        time.sleep(0.02)
    raise AssertionError(f"pid {pid} never became a worker")


def live(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return sorted(out)


def workers_of(tree: dict) -> dict[str, dict]:
    """Every replica of the tree by ref, wherever it sits."""
    out = {}
    for r in tree["replicas"]:
        nodes = list(r["components"])
        for sg in r["scaling_groups"]:
            nodes += [c for gr in sg["replicas"] for c in gr["components"]]
        for c in nodes:
            for rep in c["replicas"]:
                out[f"{c['path']}/{rep['index']}"] = rep
    return out


def check(cgd: Cgd, sizes: Sizes, count: int, bystander: int) -> dict[str, int]:
    """The groups, the workers and what each uses; returns the worker pids by ref."""
    uses = expected_uses(sizes)
    names = sorted({g for groups in uses.values() for g in groups})
    tree = json.loads(cgctl(cgd, "--json", "get", "rs"))
    assert [g["id"] for g in tree["groups"]] == names and len(names) == count
    _, listed = cgd.request("GET", "/v1/groups")
    assert sorted(g["id"] for g in listed["groups"] if g["owner"] != "bystander") == names
    devices = {g["id"]: {d["index"] for d in g["devices"]} for g in tree["groups"]}
    users = {g["id"]: g["users"] for g in tree["groups"]}
    workers = workers_of(tree)
    assert sorted(workers) == sorted(uses)
    pids = {}
    for ref, rep in workers.items():
        assert len(rep["pids"]) == 1, (ref, rep)
        pid = pids[ref] = rep["pids"][0]
        env = proc_env(pid)
        assert f"{env['CG_COMPONENT']}/{env['CG_REPLICA']}" == ref
        assert sorted(env["CG_GROUP"].split(",")) == uses[ref] == rep["groups"], ref
        assert all(ref in users[g] for g in uses[ref])
        visible = sorted({i for g in uses[ref] for i in devices[g]})
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, visible)), ref
        assert env["CG_ROLE"] == ("shadow" if "-standby/" in ref else "primary")
    assert live(cgd.worker_pids()) == sorted([*pids.values(), bystander]), "no worker beyond the deployment's"
    return pids


def test_grove_hierarchical_resource_sharing(cgd: Cgd, tmp_path: Path) -> None:
    started = time.monotonic()
    deployment = tmp_path / "grove-sharing.toml"
    deployment.write_text(EXAMPLE.read_text().replace('"python3"', json.dumps(sys.executable)))
    cgctl(cgd, "allocate", "bystander", "--memory", "1GiB", "--", sys.executable, "-c", SLEEPER)
    _, by = cgd.request("GET", "/v1/components/bystander")
    bystander = by["replicas"][0]["pids"][0]

    out = cgctl(cgd, "apply", "-f", str(deployment))
    assert out.startswith("deployment rs created: 12 groups, 6 workers")
    pids = check(cgd, [(2, 1)], 12, bystander)
    assert sorted(g["id"] for g in json.loads(cgctl(cgd, "--json", "get", "rs"))["groups"]) == INITIAL
    text = cgctl(cgd, "get", "rs")
    assert "scaling group sga (rs-0-sga)  2 replicas" in text and "shadow of rs-0-worker-a" in text

    steps = [
        ("rs/sga", 1, [(1, 1)], 10), ("rs/sga", 3, [(3, 1)], 14),
        ("rs/worker-a", 2, [(3, 2)], 15), ("rs/worker-a", 1, [(3, 1)], 14),
        ("rs", 2, [(3, 1), (2, 1)], 24), ("rs", 1, [(3, 1)], 14),
    ]
    for target, replicas, sizes, count in steps:
        before = pids
        out = cgctl(cgd, "scale", target, "--replicas", str(replicas))
        assert out.startswith(f"deployment rs scaled: {count} groups"), out
        pids = check(cgd, sizes, count, bystander)
        for ref in set(before) & set(pids):
            assert pids[ref] == before[ref], f"{ref} kept running through {target} -> {replicas}"
        for ref in set(before) - set(pids):
            assert not live([before[ref]]), f"{ref} was stopped"

    state = cgd.state()
    refused = cgd.cgctl("scale", "rs/sga", "--replicas", "300")
    assert refused.returncode == 1 and "cgctl: error: needs" in refused.stderr, refused.stderr
    assert cgd.state() == state, "a claim that does not fit changes nothing"
    changed = deployment.read_text().replace(
        '{ claim = "rank", scope = "per-replica" }', '{ claim = "rank", scope = "all-replicas" }')
    deployment.write_text(changed)
    refused = cgd.cgctl("apply", "-f", str(deployment))
    assert refused.returncode == 1
    assert f"{deployment}: field is immutable: scaling_groups[0].sharing[1].scope" in refused.stderr
    invalid = tmp_path / "invalid.toml"
    invalid.write_text(changed.replace('filter = { components = ["worker-a"] }', 'filter = { components = [] }'))
    refused = cgd.cgctl("apply", "-f", str(invalid))
    assert refused.returncode == 1
    assert f"{invalid}: sharing[2].filter: a filter must name at least one child" in refused.stderr
    assert cgd.state() == state, "a refused apply changes nothing"
    assert check(cgd, [(3, 1)], 14, bystander) == pids

    out = cgctl(cgd, "delete", "-f", str(deployment))
    assert out.startswith("deleted rs: 8 components, 14 groups, 8 workers stopped")
    assert not live(list(pids.values()))
    _, listed = cgd.request("GET", "/v1/groups")
    assert [(g["owner"], g["users"]) for g in listed["groups"]] == [("bystander", ["bystander/0"])]
    _, components = cgd.request("GET", "/v1/components")
    assert [c["name"] for c in components["components"]] == ["bystander"]
    assert live(cgd.worker_pids()) == [bystander]
    assert json.loads(cgctl(cgd, "--json", "get")) == {"deployments": []}
    assert time.monotonic() - started < 40


def test_names_taken_outside_the_deployment_are_refused_and_its_components_are_its_own(cgd: Cgd) -> None:
    data = {"name": "rs", "claims": [{"name": "x", "memory": "1GiB"}],
            "components": [{"name": "w", "sharing": [{"claim": "x", "scope": "per-replica"}]}]}
    status, reply = cgd.request("POST", "/v1/components", {"name": "rs-0-w", "claim": {"gpus": 1}})
    assert status == 201, reply
    state = cgd.state()
    status, reply = cgd.request("POST", "/v1/deployments", {"spec": data, "source": "/srv/rs.toml"})
    assert status == 409 and reply["error"]["message"].startswith(
        "components[0] (set replica 0): component 'rs-0-w' exists outside deployment 'rs'"), reply
    for body in ({"spec": [], "source": "x"}, {"spec": data, "colour": 1}, {"source": "x"}):
        status, reply = cgd.request("POST", "/v1/deployments", body)
        assert status == 400, (body, reply)
    assert cgd.state() == state

    data["name"] = "other"
    status, reply = cgd.request("POST", "/v1/deployments", {"spec": data, "source": "/srv/other.toml"})
    assert status == 200 and reply["groups"][0]["id"] == "other-0-w-0-x", reply
    refused: tuple[tuple[str, str, dict[str, int] | None], ...] = (
        ("DELETE", "/v1/components/other-0-w", None), ("POST", "/v1/components/other-0-w/scale", {"replicas": 2}))
    for method, path, payload in refused:
        status, reply = cgd.request(method, path, payload)
        assert status == 400 and "belongs to deployment 'other'" in reply["error"]["message"], reply
    status, reply = cgd.request("POST", "/v1/deployments/other/scale", {"target": "nope", "replicas": 2})
    assert status == 404, reply
    assert cgd.request("DELETE", "/v1/deployments/other")[0] == 200
    _, groups = cgd.request("GET", "/v1/groups")
    assert [g["owner"] for g in groups["groups"]] == ["rs-0-w"]


def test_a_deployment_whose_workers_stop_slowly_does_not_stall_others(cgd: Cgd) -> None:
    import threading

    stubborn = ("import signal, time\nsignal.signal(signal.SIGTERM, lambda *_: print('term', flush=True))\n"
                "print('ready', flush=True)\nwhile True: time.sleep(0.05)\n")
    data = {"name": "slow", "claims": [{"name": "x", "memory": "1GiB"}],
            "components": [{"name": "w", "command": [sys.executable, "-c", stubborn], "stop_timeout_s": 3,
                            "sharing": [{"claim": "x", "scope": "per-replica"}]}]}
    status, reply = cgd.request("POST", "/v1/deployments", {"spec": data, "source": "/srv/slow.toml"})
    assert status == 200, reply
    log = cgd.log_dir / "slow-0-w" / "0.out"
    deadline = time.monotonic() + 10
    while not (log.exists() and "ready" in log.read_text()):
        assert time.monotonic() < deadline, cgd.log()
        time.sleep(0.05)
    deleted: list[tuple[int, Any]] = []
    began = time.monotonic()
    deleter = threading.Thread(target=lambda: deleted.append(cgd.request("DELETE", "/v1/deployments/slow")))
    deleter.start()
    # The delete is under way once the worker was told to stop (it ignores that).
    wait_for(lambda: "term" in log.read_text(), "the deletion signals the worker")
    status, reply = cgd.request("POST", "/v1/components", {"name": "other", "claim": {"gpus": 1}})
    assert status == 201, reply
    status, reply = cgd.request("POST", "/v1/deployments/slow/scale", {"target": None, "replicas": 2})
    assert status == 409 and "is being changed" in reply["error"]["message"], reply
    status, reply = cgd.request("POST", "/v1/components", {"name": "rider", "share_with": "slow-0-w"})
    assert status == 409 and "being changed by deployment 'slow'" in reply["error"]["message"], reply
    assert time.monotonic() - began < 2.5
    deleter.join(timeout=20)
    assert deleted[0][0] == 200 and deleted[0][1]["components"] == ["slow-0-w"], deleted
    assert time.monotonic() - began >= 3
    _, groups = cgd.request("GET", "/v1/groups")
    assert [g["owner"] for g in groups["groups"]] == ["other"]


def test_a_component_or_reservation_cannot_take_a_path_of_a_deployment(cgd: Cgd) -> None:
    data = {"name": "rs", "claims": [{"name": "x", "memory": "1GiB"}],
            "components": [{"name": "w", "sharing": [{"claim": "x", "scope": "per-replica"}]}],
            "scaling_groups": [{"name": "sg", "components": ["w"]}]}
    status, reply = cgd.request("POST", "/v1/deployments", {"spec": data, "source": "/srv/rs.toml"})
    assert status == 200, reply
    state = cgd.state()
    for path in ("rs", "rs-0-sg"):
        status, reply = cgd.request("POST", "/v1/components", {"name": path, "claim": {"gpus": 1}})
        assert status == 409 and reply["error"]["message"] == (
            f"{path!r} is a path of deployment 'rs', whose groups it names: pick another name"), reply
        status, reply = cgd.request("POST", "/v1/reservations", {"name": path, "claim": {"gpus": 1}, "ttl_s": 60})
        assert status == 409 and "is a path of deployment 'rs'" in reply["error"]["message"], reply
    assert cgd.state() == state
    # A set replica owns no group here (no set-level sharing): the name stays free.
    assert cgd.request("POST", "/v1/components", {"name": "rs-0", "claim": {"gpus": 1}})[0] == 201


def test_a_worker_that_cannot_start_undoes_the_whole_change(cgd: Cgd) -> None:
    data = {"name": "dd", "claims": [{"name": "x", "memory": "1GiB"}],
            "components": [{"name": "w", "command": [sys.executable, "-c", SLEEPER], "replicas": 1,
                            "sharing": [{"claim": "x", "scope": "per-replica"}]}]}
    blocked = cgd.log_dir / "dd-0-w" / "1.out"
    blocked.mkdir(parents=True)  # a directory where replica 1's log file goes: it cannot start
    status, reply = cgd.request("POST", "/v1/deployments", {"spec": data, "source": "/srv/dd.toml"})
    assert status == 200, reply
    state = cgd.state()
    status, reply = cgd.request("POST", "/v1/deployments/dd/scale", {"target": "w", "replicas": 2})
    assert status == 400 and "could not start the workers of deployment 'dd'" in reply["error"]["message"], reply
    after = cgd.state()
    for key in ("components", "groups", "deployments"):
        assert after[key] == state[key], key
    assert list(after["workers"]) == ["dd-0-w/0"]
    assert live([after["workers"]["dd-0-w/0"]["pid"]]), "replica 0 kept running"
    blocked.rmdir()
    status, reply = cgd.request("POST", "/v1/deployments/dd/scale", {"target": "w", "replicas": 2})
    assert status == 200, reply


def test_a_deployment_runs_services_unless_a_component_says_otherwise(cgd: Cgd, tmp_path: Path) -> None:
    """Components of a deployment default to `always`; `restart.policy` makes one a job."""
    deployment = tmp_path / "mixed.toml"
    deployment.write_text(
        'name = "mixed"\n\n[[claims]]\nname = "one"\ngpus = 1\n\n'
        '[[components]]\nname = "svc"\ncommand = ["sh", "-c", "echo run; exit 0"]\n'
        'restart = {max_retries = 100, backoff_s = 0}\nsharing = [{claim = "one", scope = "per-replica"}]\n\n'
        '[[components]]\nname = "job"\ncommand = ["sh", "-c", "echo run; exit 0"]\n'
        'restart = {policy = "on-failure"}\nsharing = [{claim = "one", scope = "per-replica"}]\n\n'
        '[[components]]\nname = "once"\ncommand = ["sh", "-c", "echo run; exit 4"]\n'
        'restart = {policy = "never"}\nsharing = [{claim = "one", scope = "per-replica"}]\n')
    cgctl(cgd, "apply", "-f", str(deployment))

    def runs(name: str) -> int:
        log = cgd.log_dir / f"mixed-0-{name}" / "0.out"
        return log.read_text().count("run\n") if log.exists() else 0

    for name, state, code in (("job", "completed", 0), ("once", "failed", 4)):
        status, reply = cgd.request("GET", f"/v1/components/mixed-0-{name}/wait?until=ended&timeout=20", timeout=25)
        assert status == 200 and reply["reached"], reply
        assert (reply["component"]["state"], reply["component"]["exit_code"]) == (state, code), reply
        assert reply["component"]["restart"] == ("on-failure" if name == "job" else "never")
        assert runs(name) == 1
    wait_for(lambda: runs("svc") >= 3, "the service started again after exiting 0")
    status, svc = cgd.request("GET", "/v1/components/mixed-0-svc")
    assert svc["restart"] == "always" and svc["state"] in ("running", "restarting"), svc
    assert sorted(cgd.state()["groups"]) == ["mixed-0-svc-0-one"]  # the ended jobs gave theirs back

    cgctl(cgd, "apply", "-f", str(deployment))  # the same file: the ended jobs stay as they are
    assert sorted(cgd.state()["groups"]) == ["mixed-0-svc-0-one"]
    _, job = cgd.request("GET", "/v1/components/mixed-0-job")
    assert job["state"] == "completed" and runs("job") == 1, job

    deployment.write_text(deployment.read_text().replace("echo run; exit 4", "echo run; exit 0"))
    cgctl(cgd, "apply", "-f", str(deployment))  # a job that changed runs anew
    status, reply = cgd.request("GET", "/v1/components/mixed-0-once/wait?until=ended&timeout=20", timeout=25)
    assert reply["reached"] and (reply["component"]["state"], reply["component"]["exit_code"]) == ("completed", 0)
    assert runs("once") == 2 and sorted(cgd.state()["groups"]) == ["mixed-0-svc-0-one"]
