"""Documents shaped like docs/api.md (and daemon/views.py), for rendering tests."""

from __future__ import annotations

from typing import Any


def device(index: int, memory: int = 81559, pct: int = 100, whole: bool = True,
           mig: str | None = None) -> dict[str, Any]:
    return {"index": index, "uuid": f"GPU-{index:04d}", "mig_uuid": mig, "memory_mib": memory,
            "compute_pct": pct, "whole": whole}


def component(name: str = "web", replicas: int = 2, user: str = "ada") -> dict[str, Any]:
    return {
        "name": name, "owner": {"uid": 1000, "gid": 1000, "user": user}, "state": "running",
        "replicas_wanted": replicas, "scope": "per-replica", "share_with": None, "shadow_of": None,
        "deployment": None, "command": ["python", "serve.py"], "created": 1763740000.0, "lease_pid": None,
        "replicas": [
            {"index": i, "group": f"{name}-{i}", "groups": [f"{name}-{i}"], "role": "primary",
             "state": "running", "restarts": 0, "promotions": 0,
             "devices": [device(i)] if i == 0 else [device(i, 20480, 30, False)],
             "cuda_visible_devices": str(i), "pids": [4242 + i]}
            for i in range(replicas)
        ],
        "explanation": "GPU 0: emptiest NVLink island",
    }


def gpu(index: int, **over: Any) -> dict[str, Any]:
    doc = {
        "index": index, "uuid": f"GPU-{index:04d}", "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81920,
        "memory_allocated_mib": 0, "memory_foreign_mib": 0, "compute_allocated_pct": 0,
        "exclusive_owner": None, "components": [], "groups": [], "health": "ok", "reasons": [],
        "drained": False, "degraded": False, "foreign_processes": [], "over_share": [], "mig_devices": [],
        "temperature_c": 40,
    }
    doc.update(over)
    return doc


def status() -> dict[str, Any]:
    return {"generation": 7, "lost_groups": [], "gpus": [
        gpu(0, memory_allocated_mib=81920, compute_allocated_pct=100, exclusive_owner="web",
            components=["web"], groups=["web-0"]),
        gpu(1, memory_allocated_mib=20480, memory_foreign_mib=20480, compute_allocated_pct=30,
            components=["web"], groups=["web-1"],
            foreign_processes=[{"pid": 777, "used_memory_mib": 20480}]),
        gpu(2, drained=True),
        gpu(3, health="failed", degraded=True, reasons=["Xid 79: fell off the bus"]),
    ]}


def measured(util: int | None = 87, used: int | None = 49152, temp: int | None = 61) -> dict[str, Any]:
    """A GpuStatus `measured` block as cgd's NVML sampler fills it."""
    return {"utilization_gpu_pct": util, "utilization_memory_pct": 40 if util is not None else None,
            "memory_used_mib": used, "temperature_c": temp, "sampled_at": 1763740100.0}


def replica(index: int, gpu: int, state: str = "running", role: str = "primary") -> dict[str, Any]:
    return {"index": index, "group": None, "groups": [], "role": role, "state": state, "restarts": 0,
            "devices": [device(gpu)], "cuda_visible_devices": str(gpu), "pids": []}


def owned(name: str, state: str, replicas: list[dict[str, Any]], user: str = "ada",
          shadow_of: str | None = None) -> dict[str, Any]:
    """A Component document (`GET /v1/components`) with only what the status reads."""
    return {"name": name, "owner": {"uid": 1000, "gid": 1000, "user": user}, "state": state,
            "shadow_of": shadow_of, "replicas": replicas}


def busy_machine() -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """Eight GPUs with one of everything `cgctl status` tells apart: the documents of
    `GET /v1/status`, `/v1/components` and `/v1/reservations`, read at one moment."""
    gpus = [
        gpu(0, memory_mib=81559, memory_allocated_mib=81559, groups=["web-0"], exclusive_owner="web",
            components=[{"name": "web", "memory_used_mib": 40960}, {"name": "web-sb", "memory_used_mib": 8192}],
            measured=measured(87, 49152, 61)),
        gpu(1, memory_mib=81559, memory_allocated_mib=81559, groups=["crash-0"], components=["crash"],
            measured=measured(0, 0, 35)),
        gpu(2, memory_mib=81559, memory_allocated_mib=81559, groups=["later-0"], components=["later"],
            measured=None),
        gpu(3, memory_mib=81559, memory_allocated_mib=61440, groups=["s-a-0", "s-b-0", "s-c-0"],
            components=["small-a", "small-b", "small-c"], measured=measured(35, 30720, 50)),
        gpu(4, memory_mib=81559, memory_allocated_mib=81559, groups=["job-0", "job-1"], components=["job"],
            measured=measured(None, None, None)),
        gpu(5, memory_mib=81559, drained=True, measured=measured(0, 0, 33)),
        gpu(6, memory_mib=81559, health="failed", degraded=True, reasons=["Xid 79: fell off the bus"]),
        gpu(7, memory_mib=81559, memory_allocated_mib=20480, memory_foreign_mib=20480, groups=["ghost-0"],
            components=["ghost"], foreign_processes=[{"pid": 777, "used_memory_mib": 20480}],
            measured=measured(12, 41000, 44)),
    ]
    components = [
        owned("web", "running", [replica(0, 0)]),
        owned("web-sb", "running", [replica(0, 0, role="shadow")], shadow_of="web"),
        owned("crash", "restarting", [replica(0, 1, "restarting")], user="bob"),
        *(owned(f"small-{x}", "running", [replica(0, 3)]) for x in "abc"),
        owned("job", "running", [replica(0, 4, "completed"), replica(1, 4, "failed")], user="carol"),
        owned("big", "pending", [{**replica(0, 0, "pending"), "devices": []}], user="carol"),
    ]
    reservations = [{"name": "later", "owner": {"uid": 1001, "gid": 1001, "user": "bob"}, "expires_at": None,
                     "priority": 0, "groups": [{"id": "later-0", "devices": [device(2)]}]}]
    doc = {"generation": 9, "gpus": gpus, "lost_groups": [], "state_loss": [], "components": [
        {"name": "big", "state": "pending", "user": "carol", "queue": {"position": 1, "reason": "needs 8 GPUs"},
         "exit_code": None, "ended_at": None, "duration_s": None, "restarts": 0},
        {"name": "crash", "state": "restarting", "user": "bob", "queue": None, "exit_code": None,
         "ended_at": None, "duration_s": None, "restarts": 3},
    ]}
    return doc, components, reservations


def wide_machine(count: int = 72, island: int = 8) -> tuple[dict[str, Any], list[dict[str, Any]], list[list[int]]]:
    """`count` GPUs in NVLink islands of `island`, a component on the first GPU of each island:
    the status and component documents, and the islands as `GET /v1/machine` lists them."""
    gpus = [gpu(i, components=[f"job-{i}"] if i % island == 0 else [],
                groups=[f"job-{i}-0"] if i % island == 0 else [],
                memory_allocated_mib=81920 if i % island == 0 else 0,
                measured=measured(50, 40960, 50) if i % island == 0 else measured(0, 0, 35))
            for i in range(count)]
    components = [owned(f"job-{i}", "running", [replica(0, i)]) for i in range(0, count, island)]
    islands = [list(range(start, min(start + island, count))) for start in range(0, count, island)]
    return {"generation": 1, "gpus": gpus, "lost_groups": [], "state_loss": [], "components": []}, components, islands


LONG_NAME = "a-very-long-component-name-for-testing"
"""38 characters: the name a new user gave a component in the trial that found `cgctl list` 140 wide."""
IN_THE_WAY = ("needs 8 whole GPUs; 0 free (not free: in use by root (component web): GPU 0; in use by root "
              "(component crash): GPU 1; in use by root (reservation later): GPU 2; in use by root (components "
              "small-a, small-b, small-c): GPU 3; in use by root (component sweep): GPUs 4,7; in use by root "
              "(component train): GPUs 5,6)")
"""cgd's reason for a queued claim on a full DGX H100, as `allocate --detach` and `list` got it."""


def listed(name: str, gpus: list[int], state: str = "running", cpus: str = "0-55,112-167",
           queue: dict[str, Any] | None = None) -> dict[str, Any]:
    """A component of `GET /v1/components` with one replica on `gpus`, bound to `cpus`."""
    return {**component(name, 1, "root"), "state": state, "queue": queue,
            "replicas": [{"index": 0, "group": None if queue else f"{name}-0", "groups": [], "role": "primary",
                          "state": state, "restarts": 0, "devices": [device(i) for i in gpus],
                          "cuda_visible_devices": ",".join(map(str, gpus)), "cpu_binding": None if queue else cpus,
                          "pids": [] if queue else [28906 + len(name)]}]}


def crowded_list() -> list[dict[str, Any]]:
    """What `cgctl list` showed on the trial's DGX H100: NUMA-bound replicas, two claims queued."""
    return [listed("crash", [1], "restarting"),
            listed("eval", [], "pending", queue={"position": 1, "reason": IN_THE_WAY}),
            listed(f"{LONG_NAME}1", [], "pending",
                   queue={"position": 2, "reason": "claim: does not fit now: 1 queued claim of this priority or "
                          "higher goes first (the first is 'eval' of root)"}),
            listed(f"{LONG_NAME}2", [3]), listed("train", [5, 6], cpus="56-111,168-223"),
            listed("web", [0]), listed("web-standby", [0])]


def cpu_replica(index: int, cpus: int, state: str = "running") -> dict[str, Any]:
    """A replica of a CPU-only claim: CPUs counted, no device, CUDA_VISIBLE_DEVICES empty."""
    return {"index": index, "group": None, "groups": [], "role": "primary", "state": state, "restarts": 0,
            "devices": [], "cuda_visible_devices": "", "cpus": cpus, "cpu_binding": None, "pids": []}


def with_cpu_only() -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """`busy_machine` and components on CPUs alone: two holding them, one queued, one ended."""
    doc, components, reservations = busy_machine()
    components += [owned("etl", "running", [cpu_replica(0, 4)], user="bob"),
                   owned("prep", "allocated", [cpu_replica(0, 2, "allocated"), cpu_replica(1, 2, "allocated")]),
                   owned("later-cpu", "pending", [cpu_replica(0, 8, "pending")]),
                   owned("done", "completed", [cpu_replica(0, 1, "completed")])]
    return doc, components, reservations
