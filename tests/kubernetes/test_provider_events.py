"""`events()` on a cluster: the claims' and holder pods' changes, watched, as cgd's events.

Against the emulated API server (tests/kubernetes/emulator.py), whose watch
numbers every change as etcd does and answers 410 Gone for what it no longer
keeps; the test plays the scheduler where it holds or lets go of a claim.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("lightkube", reason="the Kubernetes provider's tests need lightkube: pip install '.[test]'")
pytest.importorskip("kmock", reason="the emulated cluster needs kmock: pip install '.[test]'")

from computegroups.daemon.client import ComputeGroupManager
from tests.kubernetes.emulator import CLAIMS, HOLD_REASON, NAMESPACE, PODS, EmulatedCluster
from tests.kubernetes.test_provider import on_cluster

T = TypeVar("T")
Event = dict[str, Any]


async def until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Poll what the test can observe, never a fixed sleep."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def following(m: ComputeGroupManager, since: int | None = None) -> AsyncIterator[list[Event]]:
    """The events as they come, in a list the test reads while it acts."""
    seen: list[Event] = []

    async def follow() -> None:
        async for event in m.events(since, follow=True):
            seen.append(event)

    task = asyncio.ensure_future(follow())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task  # a stream that broke off raises here


def of(events: list[Event], group: str) -> list[str]:
    return [e["type"] for e in events if e.get("group") == group]


def test_following_sees_a_group_queued_placed_and_released(cluster: EmulatedCluster, kubeconfig: Path) -> None:
    async def scenario(m: ComputeGroupManager) -> list[Event]:
        async with following(m) as seen:
            group = await m.allocate_compute_group("train", {"gpus": 2})
            await until(lambda: "placed" in of(seen, "train-0"), "the allocation in the stream")
            assert await m.deallocate_compute_group(group.id)
            await until(lambda: "released" in of(seen, "train-0"), "the release in the stream")
        return seen

    seen = on_cluster(kubeconfig, scenario)
    assert of(seen, "train-0") == ["queued", "placed", "released"]
    queued, placed, released = [e for e in seen if e.get("group") == "train-0"]
    assert queued["component"] == "train" and queued["reason"] is None
    assert placed["gpus"] == [0, 1] and placed["node"] == "dgx-h100"
    assert [d["uuid"] for d in placed["devices"]] == ["GPU-dgx-h100-0000", "GPU-dgx-h100-0001"]
    assert queued["seq"] < placed["seq"] < released["seq"]
    for e in (queued, placed, released):
        assert {"seq", "time", "type", "uid", "user", "message", "component"} <= set(e)
        assert e["uid"] is None and e["user"] is None and e["message"]


def test_the_scheduler_holding_a_claim_gives_its_reason_then_the_placement(
        cluster: EmulatedCluster, kubeconfig: Path) -> None:
    cluster.scheduling = "hold"

    async def scenario(m: ComputeGroupManager) -> list[Event]:
        async with following(m) as seen:
            group = await m.allocate_compute_group("big", {"gpus": 1})
            assert group.allocation_state == "pending"
            await until(lambda: of(seen, "big-0") == ["queued", "queued"], "the scheduler's reason")
            cluster.scheduling = "allocate"
            await until(lambda: "placed" in of(seen, "big-0"), "the placement once the scheduler lets go")
        return seen

    seen = on_cluster(kubeconfig, scenario, timeout=0.2)
    first, reason, placed = [e for e in seen if e.get("group") == "big-0"]
    assert first["reason"] is None and reason["reason"] == HOLD_REASON and reason["pod"] == "big-0-holder"
    assert placed["type"] == "placed" and placed["gpus"] == [0]


def test_a_holder_container_that_exits_is_a_worker_exited_with_its_code(
        cluster: EmulatedCluster, kubeconfig: Path) -> None:
    async def scenario(m: ComputeGroupManager) -> list[Event]:
        async with following(m) as seen:
            await m.allocate_compute_group("svc", {"gpus": 1})
            await until(lambda: "placed" in of(seen, "svc-0"), "the allocation")
            cluster.call(lambda: terminate(cluster, "svc-0-holder", 3))
            await until(lambda: "worker_exited" in of(seen, "svc-0"), "the container's exit")
        return seen

    (exited,) = [e for e in on_cluster(kubeconfig, scenario) if e["type"] == "worker_exited"]
    assert (exited["component"], exited["replica"], exited["exit_code"], exited["then"]) == ("svc", 0, 3, "restart")
    assert exited["pod"] == "svc-0-holder" and exited["container"] == "holder"


async def terminate(cluster: EmulatedCluster, pod: str, code: int) -> None:
    """The kubelet's part: the holder's container ended with `code` and restarts (restartPolicy Always)."""
    assert cluster.emulator is not None
    async with cluster.emulator._lock:
        cluster.emulator.objects[PODS, NAMESPACE, pod].patch({"status": {"containerStatuses": [{
            "name": "holder", "image": "registry.k8s.io/pause:3.10", "imageID": "", "ready": False,
            "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": code, "reason": "Error",
                                         "finishedAt": "2026-11-25T08:00:00Z"}}}]}})
        cluster.emulator.record()


def test_since_resumes_after_a_seq_and_a_version_no_longer_kept_is_a_gap(
        cluster: EmulatedCluster, kubeconfig: Path) -> None:
    async def scenario(m: ComputeGroupManager) -> tuple[list[Event], list[Event], list[Event]]:
        async with following(m) as seen:
            group = await m.allocate_compute_group("train", {"gpus": 1})
            await until(lambda: "placed" in of(seen, "train-0"), "the allocation")
            placed = next(e for e in seen if e["type"] == "placed")
            await m.deallocate_compute_group(group.id)
            await until(lambda: "released" in of(seen, "train-0"), "the release")
        await until(lambda: not cluster.objects(CLAIMS), "the claim gone (its finalizer let go)")
        after = [e async for e in m.events(placed["seq"], follow=False)]
        now = [e async for e in m.events(None, follow=False)]
        cluster.call(lambda: compact(cluster))
        await m.allocate_compute_group("next", {"gpus": 1})
        gone = [e async for e in m.events(placed["seq"], follow=False)]
        return after, now, gone

    after, now, gone = on_cluster(kubeconfig, scenario)
    assert [e["type"] for e in after] == ["released"]
    assert now == []  # nothing of ours is there now, and no history is replayed without since
    gap, *rest = gone
    assert gap["type"] == "gap" and gap["seq"] is None and gap["after"] < rest[0]["seq"]
    assert "no longer keeps" in gap["message"]
    assert [(e["type"], e["group"]) for e in rest] == [("allocated", "next-0")]


async def compact(cluster: EmulatedCluster) -> None:
    """The API server's watch cache lets go of every change kept so far."""
    assert cluster.emulator is not None
    async with cluster.emulator._lock:
        cluster.emulator.compact()


def test_since_must_be_a_version(cluster: EmulatedCluster, kubeconfig: Path) -> None:
    async def scenario(m: ComputeGroupManager) -> None:
        with pytest.raises(ValueError, match="since: a resourceVersion"):
            async for _ in m.events(-1, follow=False):
                pass

    on_cluster(kubeconfig, scenario)
