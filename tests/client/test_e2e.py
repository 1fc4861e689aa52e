"""The Python client against a real cgd on a simulated dgx-h100."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from computegroups.daemon.client import (
    AsyncCgdClient,
    CgdClient,
    CgdError,
    ComputeGroupManager,
    LocalComputeResourceProvider,
)
from tests.daemon_fixture import Cgd

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def manager(cgd: Cgd) -> ComputeGroupManager:
    return ComputeGroupManager(LocalComputeResourceProvider(cgd.socket))


def test_node_groups_and_summary(cgd: Cgd) -> None:
    async def scenario() -> None:
        m = manager(cgd)
        (node,) = await m.list_compute_nodes()
        assert node.resources["gpus"] == 8 and node.compute_groups == []
        assert node.utilization["memory_allocated"] == 0.0 and node.utilization["compute_allocated"] == 0.0
        for _ in range(500):  # the health loop's first sample of the idle GPUs
            if node.utilization["gpu_utilization"] is not None:
                break
            await asyncio.sleep(0.02)
            (node,) = await m.list_compute_nodes()
        assert node.utilization["gpu_utilization"] == 0.0, "an idle GPU is not 'utilized' by being claimed"

        group = await m.allocate_compute_group("train", {"gpus": 2}, {"colocate": "nvlink", "replicas": 2})
        assert group.id == "train-0" and group.component == "train" and group.allocation_state == "allocated"
        assert group.resources["gpus"] == 2 and len(group.topology["gpu_indices"]) == 2
        assert group.utilization["compute_allocated"] == 1.0 and group.utilization["memory_allocated"] == 1.0
        assert group.utilization["gpu_utilization"] == 0.0, "allocated is not used: nothing runs on them"

        owned = await m.get_component_allocations("train")
        assert [g.id for g in owned] == ["train-0", "train-1"]
        assert not set(owned[0].topology["gpu_indices"]) & set(owned[1].topology["gpu_indices"])

        share = await m.create_compute_group({"memory_mib": 20480, "compute_pct": 30})
        assert share.component is None and share.resources["memory_mib"] == 20480

        assert await m.drain_compute_group(share.id)
        assert (await m.get_compute_group(share.id)).allocation_state == "draining"
        assert [g.id for g in await m.list_compute_groups({"state": "draining"})] == [share.id]

        summary = await m.get_allocation_summary()
        assert summary["gpus"] == 8 and summary["groups_by_state"] == {"allocated": 2, "draining": 1}
        assert summary["components"]["train"]["groups"] == ["train-0", "train-1"]

        assert await m.deallocate_compute_group("train-1")  # the last replica's group: train scales in to 1
        assert [g.id for g in await m.get_component_allocations("train")] == ["train-0"]
        assert await m.delete_compute_group(share.id)
        assert not await m.delete_compute_group(share.id)
        assert await m.deallocate_compute_group("train-0")  # its only replica: train is released
        assert not await m.deallocate_compute_group("train-0")
        assert await m.list_compute_groups() == []

    asyncio.run(scenario())


def test_refusals_are_typed(cgd: Cgd) -> None:
    async def scenario() -> None:
        m = manager(cgd)
        with pytest.raises(CgdError) as never:
            await m.allocate_compute_group("huge", {"gpus": 64})
        assert never.value.code == "unsatisfiable"
        await m.allocate_compute_group("all", {"gpus": 8})
        with pytest.raises(CgdError) as full:
            await m.allocate_compute_group("more", {"gpus": 1})
        assert full.value.code == "insufficient_capacity"
        with pytest.raises(CgdError) as missing:
            await m.get_compute_group("nope")
        assert missing.value.code == "not_found"
        with pytest.raises(ValueError, match="unknown filter"):
            await m.list_compute_groups({"colour": "red"})

    asyncio.run(scenario())


def test_blocking_and_async_clients_agree(cgd: Cgd) -> None:
    CgdClient(cgd.socket).create_component({"name": "web", "claim": {"gpus": 1}})
    blocking = CgdClient(cgd.socket).get_component("web")
    awaited = asyncio.run(AsyncCgdClient(cgd.socket).get_component("web"))
    assert blocking == awaited and blocking["replicas"][0]["group"] == "web-0"


def test_documented_example_runs(cgd: Cgd) -> None:
    example = ROOT / "docs" / "examples" / "client_example.py"
    result = subprocess.run([sys.executable, str(example), str(cgd.socket)], capture_output=True, text=True,
                            timeout=60, check=False, env={**cgd.env(), "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert "refused as expected (unsatisfiable)" in result.stdout and result.stdout.endswith("released\n")


def test_manager_events_follow_what_happens(cgd: Cgd) -> None:
    """The async iterator sees an allocation made while it waits, and reads on from a sequence number."""
    async def scenario() -> None:
        m = manager(cgd)
        seen: list[dict] = []

        async def follow() -> None:
            async for event in m.events():
                seen.append(event)
                if event["type"] == "released":
                    return

        following = asyncio.ensure_future(follow())
        await m.allocate_compute_group("ev", {"gpus": 1})
        await m.deallocate_compute_group("ev-0")
        await asyncio.wait_for(following, 20)
        assert [(e["type"], e["component"]) for e in seen] == [("allocated", "ev"), ("released", "ev")]
        assert [e async for e in m.events(since=seen[0]["seq"], follow=False)] == seen[1:]
        with pytest.raises(CgdError, match="since: expected an integer"):
            async for _ in AsyncCgdClient(cgd.socket).events(since="soon", follow=False):
                pass

    asyncio.run(scenario())


def test_manager_events_follow_on_across_a_restart_of_cgd(cgd: Cgd) -> None:
    """cgd killed and started again under a follower: it reads on from the last event it gave,
    told by a `gap` what the old run did not keep, and sees what happens after."""
    async def scenario() -> None:
        m = manager(cgd)
        seen: list[dict] = []
        first = asyncio.Event()

        async def follow() -> None:
            async for event in m.events():
                seen.append(event)
                first.set()
                if event.get("component") == "after":
                    return

        following = asyncio.ensure_future(follow())
        await m.allocate_compute_group("before", {"gpus": 1})
        await asyncio.wait_for(first.wait(), 20)
        await asyncio.to_thread(cgd.kill9)
        await asyncio.to_thread(cgd.start)
        await m.allocate_compute_group("after", {"gpus": 1})
        await asyncio.wait_for(following, 20)
        assert [(e["type"], e.get("component")) for e in seen] == [
            ("allocated", "before"), ("gap", None), ("allocated", "after")]
        assert seen[1]["after"] == seen[0]["seq"] and seen[2]["seq"] > seen[0]["seq"]

    asyncio.run(scenario())


def test_manager_waits_go_on_across_a_clean_restart_of_cgd(start_cgd, tmp_path: Path) -> None:
    """cgd stopped with SIGTERM (as `systemctl restart` does) under a queued `allocate_compute_group`
    and a `wait_job`: both ask the next cgd, the claim is kept and placed once the job ends."""
    cgd = start_cgd("dgx-h100", "--keep-workers")
    go = tmp_path / "go"

    async def scenario() -> None:
        provider = LocalComputeResourceProvider(cgd.socket)
        m = ComputeGroupManager(provider)
        asking = 0
        poll = provider.cgd.wait_component

        async def counted(name: str, until: str, timeout: float) -> dict:
            nonlocal asking
            asking += 1
            try:
                return await poll(name, until, timeout)
            finally:
                asking -= 1

        provider.cgd.wait_component = counted
        await m.allocate_compute_group("hog", {"gpus": 8}, {"command": [
            "sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done"]})
        placing = asyncio.ensure_future(m.allocate_compute_group("waiter", {"gpus": 2}, {"wait": True}))
        ending = asyncio.ensure_future(m.wait_job("hog"))
        while asking < 2:
            await asyncio.sleep(0.02)
        assert await asyncio.to_thread(cgd.stop) == 0
        await asyncio.to_thread(cgd.start)
        go.touch()
        ended = await asyncio.wait_for(ending, 30)
        group = await asyncio.wait_for(placing, 30)
        assert (ended["name"], ended["state"], ended["exit_code"]) == ("hog", "completed", 0)
        assert group.id == "waiter-0" and len(group.gpu_indices) == 2

    asyncio.run(scenario())
    assert "internal error" not in cgd.log() and "dropped queued claims" not in cgd.log(), cgd.log()


def test_workers_get_the_callers_path_unless_the_request_sets_one(
        cgd: Cgd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As with cgctl, a program found on the caller's PATH (a venv's python) is found by the worker."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "only-on-my-path"
    tool.write_text("#!/bin/sh\necho found\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")

    async def scenario() -> None:
        m = manager(cgd)
        job = await m.submit_job("job", {"gpus": 1}, ["only-on-my-path"])
        assert job["name"] == "job"
        ended = await m.wait_job("job", timeout=30)
        assert ended["state"] == "completed", ended
        with pytest.raises(CgdError, match="only-on-my-path"):
            await m.submit_job("own", {"gpus": 1}, ["only-on-my-path"], {"env": {"PATH": "/usr/bin:/bin"}})

    asyncio.run(scenario())
    assert (cgd.log_dir / "job" / "0.out").read_text() == "found\n"
