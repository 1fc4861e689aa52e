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
