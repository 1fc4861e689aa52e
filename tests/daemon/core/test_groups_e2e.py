"""Groups made on their own are usable, and freeing one group means what it says.

Through `cgctl` and the Python `ComputeGroupManager` against a real cgd on
the simulated dgx-h100: components attach to a created group by its id and
count its capacity once; a group in use cannot be deleted; deallocating a
component's group scales it in by that replica (or refuses and says why);
a deployment's group is the deployment's.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import sys
from pathlib import Path

import pytest

from computegroups.daemon.client import CgdError, ComputeGroupManager, LocalComputeResourceProvider
from tests.daemon.core import shared_kv_deployment
from tests.daemon.deployments.test_deployments_e2e import proc_env
from tests.daemon_fixture import Cgd, wait_for

pytestmark = pytest.mark.slow
SLEEPER = "import time\nwhile True: time.sleep(3600)"


def ok(cgd: Cgd, *args: str) -> str:
    done = cgd.cgctl(*args)
    assert done.returncode == 0, (args, done.stdout, done.stderr, cgd.log())
    return done.stdout


def refused(cgd: Cgd, *args: str) -> str:
    done = cgd.cgctl(*args)
    assert done.returncode == 1, (args, done.stdout, done.stderr)
    return done.stderr


def test_components_attach_to_a_created_group_by_id(cgd: Cgd) -> None:
    created = json.loads(ok(cgd, "--json", "group", "create", "--memory", "2GiB", "--compute", "20"))
    gid = created["id"]
    ok(cgd, "allocate", "a", "--group", gid, "--replicas", "2", "--", sys.executable, "-c", SLEEPER)
    ok(cgd, "allocate", "b", "--group", gid, "--", sys.executable, "-c", SLEEPER)
    _, group = cgd.request("GET", f"/v1/groups/{gid}")
    assert group["users"] == ["a/0", "a/1", "b/0"] and group["owner"] == f"@{os.getuid()}"
    login = pwd.getpwuid(os.getuid()).pw_name
    listed = ok(cgd, "group", "list", "--owner", f"@{login}").splitlines()
    assert len(listed) == 2 and listed[1].split()[:4] == [gid, "allocated", str(group["devices"][0]["index"]) +
                                                         "[2GiB/20%]", f"@{login}"], listed
    assert ok(cgd, "group", "list", "--owner", f"@{os.getuid()}").splitlines() == listed
    assert ok(cgd, "group", "list", "--model", "H100*").splitlines() == listed, "the vendor words optional"
    assert "owner: no user named 'nobody-here'" in refused(cgd, "group", "list", "--owner", "@nobody-here")
    (gpu,) = {d["index"] for d in group["devices"]}
    _, status = cgd.request("GET", "/v1/status")
    assert status["gpus"][gpu]["memory_allocated_mib"] == 2048, "one group: its capacity counted once"
    _, a = cgd.request("GET", "/v1/components/a")
    assert a["group"] == gid and [r["groups"] for r in a["replicas"]] == [[gid], [gid]]
    env = proc_env(a["replicas"][1]["pids"][0])
    assert (env["CG_GROUP"], env["CG_GPU_MEMORY_MIB"], env["CUDA_VISIBLE_DEVICES"]) == (gid, "2048", str(gpu))

    state = cgd.state()
    err = refused(cgd, "group", "delete", gid)
    assert f"group {gid!r} is in use by 'a', 'b' (a/0, a/1, b/0): release them first" in err, err
    assert "--group uses existing groups" in cgd.cgctl("allocate", "c", "--group", gid, "--gpus", "1").stderr
    status_code, reply = cgd.request("POST", "/v1/components", {"name": "c", "group": gid, "claim": {"gpus": 1}})
    assert status_code == 400 and "claim: not allowed with group" in reply["error"]["message"]
    status_code, reply = cgd.request("POST", "/v1/components", {"name": "c", "group": "nope-9"})
    assert status_code == 404 and "no group 'nope-9'" in reply["error"]["message"]
    status_code, reply = cgd.request("POST", "/v1/components", {"name": "c", "group": "a-0"})
    assert status_code == 404
    assert cgd.state() == state, "refusals change nothing"

    ok(cgd, "scale", "a", "--replicas", "3")
    _, group = cgd.request("GET", f"/v1/groups/{gid}")
    assert group["users"] == ["a/0", "a/1", "a/2", "b/0"]
    ok(cgd, "release", "a")
    ok(cgd, "release", "b")
    _, group = cgd.request("GET", f"/v1/groups/{gid}")
    assert group["users"] == [] and group["state"] == "allocated", "the group outlives its users"
    assert f"group {gid} deleted" in ok(cgd, "group", "delete", gid)
    status_code, _ = cgd.request("GET", f"/v1/groups/{gid}")
    assert status_code == 404

    async def through_the_client() -> None:
        m = ComputeGroupManager(LocalComputeResourceProvider(cgd.socket))
        share = await m.create_compute_group({"memory_mib": 4096})
        used = await m.allocate_compute_group("c", {}, {"group": share.id, "command": [sys.executable, "-c", SLEEPER]})
        assert used.id == share.id and used.users == ["c/0"]
        with pytest.raises(CgdError, match=r"is in use by 'c' \(c/0\)"):
            await m.delete_compute_group(share.id)
        with pytest.raises(CgdError, match=r"is in use by 'c'"):
            await m.deallocate_compute_group(share.id)
        await m.provider.deallocate_resources("c", [])
        assert await m.deallocate_compute_group(share.id)
        assert not await m.deallocate_compute_group(share.id)

    asyncio.run(through_the_client())


def test_deallocating_one_group_scales_in_by_its_replica(cgd: Cgd, tmp_path: Path) -> None:
    ok(cgd, "allocate", "w", "--memory", "1GiB", "--replicas", "3", "--", sys.executable, "-c", SLEEPER)
    made = ok(cgd, "group", "create", "--memory", "1GiB")
    assert made.startswith("group group.1 created on GPU ") and "--group group.1 -- CMD" in made, made
    state = cgd.state()
    err = refused(cgd, "group", "deallocate", "w-1")
    assert ("group 'w-1' is replica 1 of 3 of 'w': replicas are numbered, so only the last one (w/2) "
            "can go alone; scale 'w' to 1 or release it") in err, err
    assert cgd.state() == state
    assert "group w-2 freed: w scaled in to 2 replicas" in ok(cgd, "group", "deallocate", "w-2")

    ok(cgd, "apply", "-f", str(shared_kv_deployment(tmp_path)))
    listed = ok(cgd, "group", "list")
    assert any(line.split()[:2] == ["d-0-x-all-kv", "allocated"] and "(d)" in line
               for line in listed.splitlines()), listed

    async def through_the_client() -> None:
        m = ComputeGroupManager(LocalComputeResourceProvider(cgd.socket))
        assert await m.deallocate_compute_group("w-1")
        assert [g.id for g in await m.get_component_allocations("w")] == ["w-0"]
        with pytest.raises(CgdError, match="group 'd-0-x-all-kv' belongs to deployment 'd': change the deployment"):
            await m.deallocate_compute_group("d-0-x-all-kv")
        assert await m.deallocate_compute_group("w-0")
        assert not await m.deallocate_compute_group("nope")

    asyncio.run(through_the_client())
    _, components = cgd.request("GET", "/v1/components")
    assert [c["name"] for c in components["components"]] == ["d-0-x"], "w went with its only replica"
    wait_for(lambda: len(cgd.worker_pids()) == 1, "only the deployment's worker is left")
