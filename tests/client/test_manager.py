"""ComputeGroupManager over an in-memory provider: the seed's objects and the
way requirements and constraints become a ComponentRequest."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from computegroups.daemon.client.manager import ComputeGroupManager
from computegroups.daemon.client.models import ComputeGroup
from computegroups.daemon.client.providers import ComputeResourceProvider


def _device(index: int, memory: int = 81559, pct: int = 100, whole: bool = True) -> dict[str, Any]:
    return {"index": index, "uuid": f"GPU-{index}", "mig_uuid": None, "memory_mib": memory,
            "compute_pct": pct, "whole": whole}


def _group(gid: str, owner: str, devices: list[dict[str, Any]], state: str = "allocated") -> dict[str, Any]:
    return {"id": gid, "state": state, "owner": owner, "users": [f"{owner}/0"], "scope": "per-replica",
            "replica": 0, "claim": {"gpus": len(devices)}, "devices": devices, "domain": [0, 1],
            "exclusive_domain": None, "priority": 0, "created": 1.0, "explanation": "", "reservation": None}


def _gpu(index: int, allocated: int = 0, foreign: int = 0, pct: int = 0,
         measured: tuple[int, int, int] | None = None) -> dict[str, Any]:
    """`measured`: (GPU %, memory %, MiB used) of the health loop's last sample, or none yet."""
    return {"index": index, "uuid": f"GPU-{index}", "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81920,
            "memory_allocated_mib": allocated, "memory_foreign_mib": foreign,
            "compute_allocated_pct": pct, "drained": index == 1, "groups": [], "health": "ok",
            "measured": None if measured is None else {
                "utilization_gpu_pct": measured[0], "utilization_memory_pct": measured[1],
                "memory_used_mib": measured[2], "temperature_c": 40, "sampled_at": 1.0}}


class MemoryProvider(ComputeResourceProvider):
    """Just enough of a provider to watch what the manager asks for."""

    def __init__(self) -> None:
        self.groups = {
            "web-0": _group("web-0", "web", [_device(0)]),
            "web-1": _group("web-1", "web", [_device(1)]),
            "group.1": _group("group.1", "@1000", [_device(2, 20480, 30, False)]),
        }
        self.gpus = [_gpu(0, 81920, 0, 100, measured=(0, 0, 512)), _gpu(1, 40960, 8192, 50, measured=(60, 20, 30720)),
                     _gpu(2, 20480, 0, 30), _gpu(3)]
        self.calls: list[tuple[str, Any]] = []

    async def discover_resources(self) -> dict[str, Any]:
        return {"nodes": [{"id": "box", "machine": {"hostname": "box"}}]}

    async def allocate_resources(self, component_name: str, resources: Mapping[str, Any]) -> dict[str, Any]:
        self.calls.append(("allocate", (component_name, dict(resources))))
        if resources.get("wait"):  # queued: placed once the manager waits for it
            return {"name": component_name, "state": "pending", "replicas": [{"index": 0, "group": None}]}
        self.groups[f"{component_name}-0"] = _group(f"{component_name}-0", component_name, [_device(3)])
        return {"name": component_name, "replicas": [{"index": 0, "group": f"{component_name}-0"}]}

    async def wait_component(self, component_name: str, until: str, timeout: float | None) -> dict[str, Any]:
        self.calls.append(("wait", (component_name, until, timeout)))
        self.groups[f"{component_name}-0"] = _group(f"{component_name}-0", component_name, [_device(3)])
        return {"name": component_name, "state": "running" if until == "placed" else "completed",
                "exit_code": None if until == "placed" else 0,
                "replicas": [{"index": 0, "group": f"{component_name}-0"}]}

    async def deallocate_resources(self, component_name: str, resource_ids: Sequence[str]) -> bool:
        self.calls.append(("deallocate", (component_name, sorted(resource_ids))))
        return True

    async def get_resource_state(self) -> dict[str, Any]:
        return {"node": "box", "gpus": self.gpus, "lost_groups": []}

    async def list_groups(self, filters: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [g for g in self.groups.values()
                if "component" not in filters or g["owner"] == filters["component"]]

    async def get_group(self, group_id: str) -> dict[str, Any]:
        return self.groups[group_id]

    async def create_group(self, claim: Mapping[str, Any], node_id: str | None) -> dict[str, Any]:
        self.calls.append(("create", (dict(claim), node_id)))
        return self.groups["group.1"]

    async def delete_group(self, group_id: str) -> bool:
        self.calls.append(("delete", group_id))
        return self.groups.pop(group_id, None) is not None

    async def deallocate_group(self, group_id: str) -> bool:
        self.calls.append(("deallocate group", group_id))
        return self.groups.pop(group_id, None) is not None

    async def drain_group(self, group_id: str) -> dict[str, Any]:
        self.calls.append(("drain", group_id))
        return self.groups[group_id]

    async def list_components(self) -> list[dict[str, Any]]:
        return [{"name": "web", "state": "running",
                 "replicas": [{"index": i, "group": f"web-{i}", "groups": [f"web-{i}"]} for i in (0, 1)]}]


@pytest.fixture
def provider() -> MemoryProvider:
    return MemoryProvider()


def test_group_carries_the_seeds_properties(provider: MemoryProvider) -> None:
    group = asyncio.run(ComputeGroupManager(provider).get_compute_group("web-1"))
    assert group.id == "web-1"
    assert group.allocation_state == "allocated"
    assert group.component == "web"
    assert group.resources["gpus"] == 1 and group.resources["memory_mib"] == 81559
    assert group.topology["gpu_indices"] == [1] and group.topology["domain"] == [0, 1]
    assert group.utilization == {"memory_allocated": 0.5, "memory_foreign": 0.1, "compute_allocated": 0.5,
                                 "memory_used": 0.375, "gpu_utilization": 0.6, "memory_utilization": 0.2}


def test_an_idle_whole_gpu_is_all_allocated_and_not_used(provider: MemoryProvider) -> None:
    group = asyncio.run(ComputeGroupManager(provider).get_compute_group("web-0"))
    assert group.utilization["memory_allocated"] == 1.0 and group.utilization["compute_allocated"] == 1.0
    assert group.utilization["gpu_utilization"] == 0.0 and group.utilization["memory_used"] == 0.0063


def test_before_a_sample_what_is_measured_is_unknown(provider: MemoryProvider) -> None:
    group = asyncio.run(ComputeGroupManager(provider).get_compute_group("group.1"))
    assert group.utilization["memory_allocated"] == 0.25
    assert [group.utilization[k] for k in ("memory_used", "gpu_utilization", "memory_utilization")] == [None] * 3


def test_group_of_no_component(provider: MemoryProvider) -> None:
    standalone = ComputeGroup.from_documents(provider.groups["group.1"])
    reserved = ComputeGroup.from_documents(_group("train-0", "train", [_device(0)], state="reserved"))
    assert standalone.component is None and reserved.component is None


def test_node_totals_and_usage(provider: MemoryProvider) -> None:
    (node,) = asyncio.run(ComputeGroupManager(provider).list_compute_nodes())
    assert node.id == "box"
    assert node.resources["gpus"] == 4 and node.resources["memory_mib"] == 4 * 81920
    assert node.resources["models"] == {"NVIDIA H100 80GB HBM3": 4}
    assert {g.id for g in node.compute_groups} == {"web-0", "web-1", "group.1"}
    assert node.utilization == {
        "memory_allocated": round((81920 + 40960 + 20480) / (4 * 81920), 4), "memory_foreign": 0.025,
        "compute_allocated": 0.45, "memory_used": round((512 + 30720) / (2 * 81920), 4),
        "gpu_utilization": 0.3, "memory_utilization": 0.1}


def test_requirements_and_placement_form_the_claim_component_keys_stay_outside(provider: MemoryProvider) -> None:
    group = asyncio.run(ComputeGroupManager(provider).allocate_compute_group(
        "train", {"gpus": 2}, {"colocate": "nvlink", "strategy": "spread", "replicas": 2,
                               "command": ["python", "train.py"]}))
    assert provider.calls == [("allocate", ("train", {
        "claim": {"gpus": 2, "colocate": "nvlink", "strategy": "spread"},
        "replicas": 2, "command": ["python", "train.py"]}))]
    assert group.id == "train-0" and group.component == "train"


def test_sharing_needs_no_claim(provider: MemoryProvider) -> None:
    asyncio.run(ComputeGroupManager(provider).allocate_compute_group("side", {}, {"share_with": "web"}))
    assert provider.calls == [("allocate", ("side", {"share_with": "web"}))]


def test_a_key_given_twice_is_refused(provider: MemoryProvider) -> None:
    with pytest.raises(ValueError, match="'gpus' is given both"):
        asyncio.run(ComputeGroupManager(provider).allocate_compute_group("x", {"gpus": 1}, {"gpus": 2}))
    assert provider.calls == []


def test_deallocating_a_group_is_the_providers_decision(provider: MemoryProvider) -> None:
    """What freeing one group means (delete, scale in, release) is decided where the state is:
    the manager asks for that group and nothing wider."""
    manager = ComputeGroupManager(provider)
    assert asyncio.run(manager.deallocate_compute_group("web-1"))
    assert not asyncio.run(manager.deallocate_compute_group("web-1"))
    assert provider.calls == [("deallocate group", "web-1")] * 2


def test_create_drain_and_component_allocations(provider: MemoryProvider) -> None:
    manager = ComputeGroupManager(provider)
    created = asyncio.run(manager.create_compute_group({"memory_mib": 20480}, "box"))
    assert created.id == "group.1" and provider.calls[0] == ("create", ({"memory_mib": 20480}, "box"))
    assert asyncio.run(manager.drain_compute_group("web-0"))
    assert [g.id for g in asyncio.run(manager.get_component_allocations("web"))] == ["web-0", "web-1"]


def test_summary(provider: MemoryProvider) -> None:
    summary = asyncio.run(ComputeGroupManager(provider).get_allocation_summary())
    assert summary["gpus"] == 4 and summary["gpus_drained"] == [1]
    assert summary["memory_allocated_mib"] == 81920 + 40960 + 20480
    assert summary["groups_by_state"] == {"allocated": 3}
    assert summary["components"] == {"web": {"state": "running", "replicas": 2, "groups": ["web-0", "web-1"]}}


def test_a_queued_allocation_waits_for_its_place(provider: MemoryProvider) -> None:
    manager = ComputeGroupManager(provider)
    group = asyncio.run(manager.allocate_compute_group("train", {"gpus": 1}, {"wait": True, "time_limit_s": 60}))
    assert group.id == "train-0"
    assert provider.calls[0] == ("allocate", ("train", {"wait": True, "time_limit_s": 60, "claim": {"gpus": 1}}))
    assert provider.calls[1] == ("wait", ("train", "placed", None))


def test_a_detached_allocation_is_refused_for_want_of_a_group(provider: MemoryProvider) -> None:
    with pytest.raises(ValueError, match="submit_job"):
        asyncio.run(ComputeGroupManager(provider).allocate_compute_group("train", {"gpus": 1},
                                                                         {"wait": True, "detach": True}))
    assert provider.calls == []


def test_submit_and_wait_for_a_job(provider: MemoryProvider) -> None:
    manager = ComputeGroupManager(provider)
    queued = asyncio.run(manager.submit_job("train", {"gpus": 8}, ["python", "train.py"],
                                            {"time_limit_s": 600, "strategy": "pack"}))
    assert queued["state"] == "pending"
    assert provider.calls[0] == ("allocate", ("train", {
        "wait": True, "detach": True, "time_limit_s": 600, "command": ["python", "train.py"],
        "claim": {"gpus": 8, "strategy": "pack"}}))
    ended = asyncio.run(manager.wait_job("train", timeout=5))
    assert ended["exit_code"] == 0 and provider.calls[1] == ("wait", ("train", "ended", 5))
