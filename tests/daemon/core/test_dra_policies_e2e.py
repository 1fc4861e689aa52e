"""DRA consumable capacity as seed 002 describes it, on a machine of two models.

Per-GPU sharing policies in cgd's config round a share up to the next
valid amount (and that amount is what it takes and shows), or refuse it
naming the policy; `share` picks a whole device, a share, or either; device
selectors (model glob, total memory, compute capability, `same = "model"`)
narrow the GPUs; and groups are found by every field they have. Through
cgctl, the HTTP API and the Python client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from computegroups.daemon.client import ComputeGroupManager, LocalComputeResourceProvider
from tests.daemon.core.test_groups_e2e import ok, refused
from tests.daemon_fixture import Cgd

pytestmark = pytest.mark.slow
MIXED = Path(__file__).parent / "machines" / "mixed-pairs.toml"
"""GPUs 0-1: A100-SXM4-40GB (8.0), NVLink pair; GPUs 2-3: H100 80GB (9.0), NVLink pair."""
POLICY = """
[sharing.memory]
default = "4GiB"
valid_range = { min = "2GiB", max = "32GiB", step = "2GiB" }
[sharing.compute]
valid_values = [10, 25, 50]
[sharing.gpus.3]
shareable = false
"""


def devices(cgd: Cgd, name: str) -> list[dict]:
    _, comp = cgd.request("GET", f"/v1/components/{name}")
    return [d for r in comp["replicas"] for d in r["devices"]]


def test_sharing_policies_round_up_or_refuse(start_cgd: Callable[..., Cgd], tmp_path: Path) -> None:
    config = tmp_path / "cgd.toml"
    config.write_text(POLICY)
    cgd = start_cgd(str(MIXED), "--config", str(config))
    out = ok(cgd, "allocate", "a", "--memory", "3GiB", "--compute", "20", "--explain")
    assert "memory 3GiB rounded up to 4GiB, compute 20% rounded up to 25% by the sharing policy of GPUs 0,1,2" \
        in " ".join(out.split()), out  # the explanation is wrapped at 80 columns
    (a,) = devices(cgd, "a")
    assert (a["memory_mib"], a["compute_pct"], a["whole"]) == (4096, 25, False) and a["index"] != 3
    _, status = cgd.request("GET", "/v1/status")
    assert status["gpus"][a["index"]]["memory_allocated_mib"] == 4096, "the rounded amount is what it takes"
    ok(cgd, "allocate", "d", "--compute", "10")
    assert [(d["memory_mib"], d["compute_pct"]) for d in devices(cgd, "d")] == [(4096, 10)], "the default"

    state = cgd.state()
    err = refused(cgd, "allocate", "b", "--memory", "40GiB")
    assert ("memory 40GiB is outside the sharing policy of GPUs 0,1,2 (memory valid_range min 2GiB max 32GiB "
            "step 2GiB); GPU 3 is not shareable (sharing policy)") in err, err
    status_code, reply = cgd.request("POST", "/v1/components", {"name": "c", "claim": {"compute_pct": 60}})
    assert status_code == 422 and reply["error"]["message"].startswith(
        "compute 60% is outside the sharing policy of GPUs 0,1,2 (compute valid_values 10%, 25%, 50%)"), reply
    assert cgd.state() == state, "refusals change nothing"

    ok(cgd, "allocate", "w", "--memory", "50GiB", "--share", "whole")
    assert [(d["index"], d["whole"]) for d in devices(cgd, "w")] in ([(2, True)], [(3, True)])
    out = ok(cgd, "allocate", "y", "--memory", "36GiB", "--share", "any", "--explain")
    (y,) = devices(cgd, "y")
    assert y["whole"] and y["memory_mib"] >= 36 * 1024 and "a whole GPU (share = any)" in out, out
    ok(cgd, "allocate", "z", "--memory", "2GiB", "--share", "any")
    assert [d["whole"] for d in devices(cgd, "z")] == [False], "any: a share first"
    usage = cgd.cgctl("allocate", "v", "--gpus", "1", "--share", "share")
    assert usage.returncode == 2 and "share: only for a memory/compute claim (gpus asks for whole devices)" \
        in usage.stderr, usage.stderr


def test_device_selectors_and_group_filters(start_cgd: Callable[..., Cgd], tmp_path: Path) -> None:
    cgd = start_cgd(str(MIXED))
    ok(cgd, "allocate", "old", "--gpus", "1", "--model", "*a100*")
    assert [d["index"] for d in devices(cgd, "old")] in ([0], [1])
    ok(cgd, "allocate", "new", "--memory", "2GiB", "--compute-capability", "9.0")
    assert [d["index"] for d in devices(cgd, "new")] in ([2], [3])
    ok(cgd, "allocate", "big", "--gpus", "1", "--min-memory", "64GiB")
    assert [d["index"] for d in devices(cgd, "big")] in ([2], [3])
    err = refused(cgd, "allocate", "none", "--gpus", "1", "--model", "*V100*")
    assert ("no GPU of this machine has model '*V100*' (it has NVIDIA A100-SXM4-40GB (40GiB, 8.0), "
            "NVIDIA H100 80GB HBM3 (79GiB, 9.0))") in err, err
    err = refused(cgd, "allocate", "three", "--gpus", "3", "--compute-capability", "9.0")
    assert "needs 3 GPUs; the GPUs with compute capability >= 9.0 have 2 GPUs for whole claims" in err, err
    err = refused(cgd, "allocate", "two", "--gpus", "2", "--compute-capability", "9.0")
    assert "needs 2 whole GPUs; 0 free" in err and "GPU 0" not in err, err
    # One A100 and one H100 are whole-free (old and big hold one each; new shares an H100... or big's):
    # two replicas of one GPU each on the same model can only be the A100s if the H100s are taken.
    ok(cgd, "release", "new")
    ok(cgd, "release", "old")
    ok(cgd, "allocate", "pair", "--gpus", "1", "--replicas", "2", "--same", "model")
    indices = sorted(d["index"] for d in devices(cgd, "pair"))
    assert indices == [0, 1], "the H100s have one whole GPU left: only the A100s give two of one model"
    status_code, reply = cgd.request("POST", "/v1/components", {
        "name": "lone", "claim": {"gpus": 1, "same": "vendor"}})
    assert status_code == 400 and "claim.same: must be one of model, got 'vendor'" in reply["error"]["message"]

    deployment = tmp_path / "d.toml"
    deployment.write_text('name = "d"\n[[claims]]\nname = "kv"\nmemory = "1GiB"\nmodel = "*H100*"\n'
                          '[[components]]\nname = "x"\nsharing = [{ claim = "kv", scope = "all-replicas" }]\n')
    ok(cgd, "apply", "-f", str(deployment))
    _, kv = cgd.request("GET", "/v1/groups/d-0-x-all-kv")
    assert kv["devices"][0]["index"] in (2, 3) and kv["deployment"] == "d"

    def listed(*args: str) -> list[str]:
        return [g["id"] for g in json.loads(ok(cgd, "--json", "group", "list", *args))["groups"]]

    uuid = kv["devices"][0]["uuid"]
    assert listed("--model", "*A100*") == ["pair-0", "pair-1"]
    assert listed("--model", "*h100*") == ["big-0", "d-0-x-all-kv"]
    assert listed("--uuid", uuid) == sorted({"d-0-x-all-kv"} | ({"big-0"} if devices(cgd, "big")[0]["uuid"] == uuid
                                                                 else set()))
    assert listed("--owner", "big") == ["big-0"]
    assert listed("--deployment", "d") == ["d-0-x-all-kv"]
    assert listed("--deployment", "d", "--model", "*A100*") == []
    status_code, reply = cgd.request("GET", "/v1/groups?pool=nope")
    assert status_code == 400 and "unknown pool 'nope'" in reply["error"]["message"]

    async def through_the_client() -> None:
        m = ComputeGroupManager(LocalComputeResourceProvider(cgd.socket))
        assert [g.id for g in await m.list_compute_groups({"model": "*A100*", "owner": "pair"})] == ["pair-0", "pair-1"]
        assert [g.id for g in await m.list_compute_groups({"deployment": "d"})] == ["d-0-x-all-kv"]
        assert [g.id for g in await m.list_compute_groups({"uuid": uuid, "state": "allocated"})][-1] == "d-0-x-all-kv"
        await m.provider.deallocate_resources("pair", [])
        group = await m.allocate_compute_group("sel", {"memory_mib": 1024}, {"model": "*A100*", "share": "whole"})
        assert group.resources["gpus"] == 1 and group.document["devices"][0]["whole"]
        with pytest.raises(ValueError, match="unknown filter 'colour'"):
            await m.list_compute_groups({"colour": "red"})

    asyncio.run(through_the_client())


def test_a_policy_for_a_gpu_the_machine_lacks_is_refused_at_start(start_cgd: Callable[..., Cgd],
                                                                   tmp_path: Path) -> None:
    config = tmp_path / "cgd.toml"
    config.write_text("[sharing.gpus.9]\nshareable = false\n")
    with pytest.raises(RuntimeError) as failed:
        start_cgd(str(MIXED), "--config", str(config))
    assert f"cgd: error: {config}: sharing.gpus.9: no GPU 9 on this machine (it has GPUs 0-3)" \
        in str(failed.value), "names the file, the GPU and the GPUs there are"
    config.write_text('[sharing.memory]\nvalid_range = { min = "32GiB", max = "2GiB" }\n')
    with pytest.raises(RuntimeError) as failed:
        start_cgd(str(MIXED), "--config", str(config))
    assert f"{config}: sharing.memory: valid_range: max 2GiB is below min 32GiB" in str(failed.value)
    config.write_text('[sharing.memory]\ndefault = "3GiB"\nvalid_values = ["2GiB", "4GiB"]\n')
    with pytest.raises(RuntimeError) as failed:
        start_cgd(str(MIXED), "--config", str(config))
    assert "sharing.memory: default: 3GiB is not a valid amount (valid_values 2GiB, 4GiB)" in str(failed.value)
