"""LeaderWorkerSet-style placement: a claim's affinity to a sibling resolves per set replica.

Seed 004: a leader and its workers are placed in one topology domain. In
a deployment, `affinity = [{component = "leader", level = "nvlink"}]` on the
workers' claim means the leader of the same set replica (`S-i-leader`),
not a component literally named `leader`; with an anti-affinity at the
device level they share an NVLink island without sharing a GPU.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from computegroups.daemon.client import ComputeGroupManager, LocalComputeResourceProvider
from tests.daemon.core.test_groups_e2e import ok, refused
from tests.daemon_fixture import Cgd

pytestmark = pytest.mark.slow

LWS = """
name = "lws"
replicas = 2

[[claims]]
name = "leader-slot"
memory = "20GiB"

[[claims]]
name = "worker-slot"
memory = "20GiB"
affinity = [{ component = "leader", level = "nvlink" }]
anti_affinity = [{ component = "leader", level = "device" }]

[[components]]
name = "leader"
sharing = [{ claim = "leader-slot", scope = "per-replica" }]

[[components]]
name = "worker"
sharing = [{ claim = "worker-slot", scope = "per-replica" }]
"""


def gpu_of(cgd: Cgd, path: str) -> int:
    _, comp = cgd.request("GET", f"/v1/components/{path}")
    (device,) = comp["replicas"][0]["devices"]
    return int(device["index"])


def test_workers_share_their_leaders_island_not_its_gpu(start_cgd, tmp_path: Path) -> None:
    cgd: Cgd = start_cgd("workstation-nvlink-pairs")  # NVLink islands {0, 1} and {2, 3}
    islands = [set(i) for i in json.loads(ok(cgd, "--json", "topo"))["nvlink_islands"]]
    deployment = tmp_path / "lws.toml"
    deployment.write_text(LWS)
    out = ok(cgd, "apply", "-f", str(deployment))
    assert out.startswith("deployment lws created: 4 groups"), out
    for i in range(2):
        leader, worker = gpu_of(cgd, f"lws-{i}-leader"), gpu_of(cgd, f"lws-{i}-worker")
        assert leader != worker, "never the leader's GPU"
        assert any({leader, worker} <= island for island in islands), (i, leader, worker)
    _, group = cgd.request("GET", "/v1/groups/lws-1-worker-0-worker-slot")
    assert group["claim"]["affinity"] == [{"component": "lws-1-leader", "level": "nvlink"}], \
        "the stored claim names the sibling it was placed beside"

    ok(cgd, "scale", "lws", "--replicas", "3")
    leader, worker = gpu_of(cgd, "lws-2-leader"), gpu_of(cgd, "lws-2-worker")
    assert leader != worker and any({leader, worker} <= island for island in islands)

    async def through_the_client() -> None:
        m = ComputeGroupManager(LocalComputeResourceProvider(cgd.socket))
        (g,) = await m.list_compute_groups({"owner": "lws-2-worker"})
        assert g.document["claim"]["affinity"][0]["component"] == "lws-2-leader"

    asyncio.run(through_the_client())

    wrong = tmp_path / "wrong.toml"
    wrong.write_text(LWS.replace('name = "lws"', 'name = "bad"').replace(
        'sharing = [{ claim = "worker-slot", scope = "per-replica" }]', "")
        + '\n[[sharing]]\nclaim = "worker-slot"\nscope = "all-replicas"\n')
    err = refused(cgd, "apply", "-f", str(wrong))
    assert (f"{wrong}: sharing[0]: claims: worker-slot.affinity: 'leader' is resolved per set replica, and the "
            "all-replicas group 'bad-all-worker-slot' has none") in err, err
