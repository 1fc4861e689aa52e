"""A draining group keeps what runs on it and takes nothing new.

Not only new placements: no new component attaches to it (`--share-with`,
`--shadow-of`, `--group`), no new replica of a component or of a
deployment, through cgctl, the HTTP API and the Python client alike; every
refusal leaves the state as it was, and undraining lets them attach again.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from computegroups.daemon.client import CgdError, ComputeGroupManager, LocalComputeResourceProvider
from tests.daemon.core import shared_kv_deployment
from tests.daemon.core.test_groups_e2e import ok, refused
from tests.daemon_fixture import Cgd

pytestmark = pytest.mark.slow
SLEEPER = "import time\nwhile True: time.sleep(3600)"


def test_nothing_new_attaches_to_a_draining_group(cgd: Cgd, tmp_path: Path) -> None:
    cmd = ("--", sys.executable, "-c", SLEEPER)
    ok(cgd, "allocate", "web", "--memory", "1GiB", "--replicas", "2", *cmd)
    ok(cgd, "allocate", "pool", "--memory", "1GiB", "--scope", "all-replicas", *cmd)
    gid = json.loads(ok(cgd, "--json", "group", "create", "--memory", "1GiB"))["id"]
    for group in ("web-0", "pool-all", gid):
        assert ok(cgd, "group", "drain", group).strip() == f"group {group} draining"
    ok(cgd, "apply", "-f", str(shared_kv_deployment(tmp_path)))
    ok(cgd, "group", "drain", "d-0-x-all-kv")
    state, pids = cgd.state(), sorted(cgd.worker_pids())

    hint = "undrain it first (`cgctl group drain {} --undrain`)"
    for args, group, who in [
        (("allocate", "side", "--share-with", "web", *cmd), "web-0", "side/0"),
        (("allocate", "side", "--share-with", "web", "--scope", "all-replicas", *cmd), "web-0", "side/0"),
        (("allocate", "standby", "--shadow-of", "web", *cmd), "web-0", "standby/0"),
        (("scale", "pool", "--replicas", "2"), "pool-all", "pool/1"),
        (("allocate", "user", "--group", gid, *cmd), gid, "user/0"),
        (("scale", "d/x", "--replicas", "2"), "d-0-x-all-kv", "d-0-x/1"),
    ]:
        err = refused(cgd, *args)
        assert f"group {group!r} is draining: nothing new attaches to it ({who}); {hint.format(group)}" in err, (
            args, err)
    status, reply = cgd.request("POST", "/v1/components", {"name": "side", "share_with": "web"})
    assert status == 409 and "group 'web-0' is draining" in reply["error"]["message"]

    async def through_the_client() -> None:
        m = ComputeGroupManager(LocalComputeResourceProvider(cgd.socket))
        with pytest.raises(CgdError, match="group 'web-0' is draining: nothing new attaches to it"):
            await m.allocate_compute_group("side", {}, {"share_with": "web"})

    asyncio.run(through_the_client())
    for args in (("group", "drain", "pr-9"), ("group", "deallocate", "nosuch")):
        err = refused(cgd, *args)
        assert "`cgctl group list` shows the groups in use" in err, (args, err)
    assert cgd.state() == state and sorted(cgd.worker_pids()) == pids, "refusals change nothing, stop nothing"

    ok(cgd, "group", "drain", "web-0", "--undrain")
    ok(cgd, "allocate", "side", "--share-with", "web", *cmd)
    _, group = cgd.request("GET", "/v1/groups/web-0")
    assert group["users"] == ["side/0", "web/0"]
