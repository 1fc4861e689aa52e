"""`list_compute_groups(filters)` on a cluster: cgd's filter keys, read from what a claim and its devices say.

Every key of `GROUP_FILTERS` is either mapped to the Group documents the
provider derives from the cluster's objects, or refused by name: a filter
that has no cluster meaning must not quietly match everything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from computegroups.daemon.client.providers import GROUP_FILTERS
from computegroups.topology.names import model_matches

Json = Any

NO_CLUSTER_MEANING = {
    "pool": "cgd's pools are sets of one machine's GPUs, named in its config; a cluster has none "
            "(a DRA pool is one node's ResourceSlices: list_compute_nodes() gives each node's groups)",
}
"""Filters refused by the Kubernetes provider, and why."""


def checked_filters(filters: Mapping[str, Json]) -> dict[str, Json]:
    """The filters given (None values dropped), or a ValueError naming the first one the cluster cannot answer."""
    unknown = sorted(set(filters) - set(GROUP_FILTERS))
    if unknown:
        raise ValueError(f"unknown filter {unknown[0]!r}: use {', '.join(GROUP_FILTERS)}")
    given = {key: value for key, value in filters.items() if value is not None and value != ""}
    for key in sorted(set(given) & set(NO_CLUSTER_MEANING)):
        raise ValueError(f"{key}: not a filter on a cluster ({NO_CLUSTER_MEANING[key]})")
    if "gpu" in given:
        try:
            given["gpu"] = int(given["gpu"])
        except (TypeError, ValueError):
            raise ValueError(f"gpu: expected a GPU index, got {given['gpu']!r}") from None
    return given


def matches(group: Mapping[str, Json], filters: Mapping[str, Json]) -> bool:
    """Whether the Group document matches every filter, as cgd's `GET /v1/groups` matches:
    `component` owns or uses it (an attached replica), `gpu` an index of its devices, `model`
    a case-blind glob over its devices' product name (the driver's `productName`), `uuid` a
    `GPU-`/`MIG-` UUID of its devices, `owner` the component that owns it, `deployment` the
    deployment its claim is labelled with."""
    devices = group.get("devices") or []
    checks = {
        "component": lambda name: group.get("owner") == name
        or any(str(u).rsplit("/", 1)[0] == name for u in group.get("users") or []),
        "state": lambda state: group.get("state") == state,
        "gpu": lambda index: any(d.get("index") == index for d in devices),
        "model": lambda glob: any(model_matches(str(d.get("name") or ""), str(glob)) for d in devices),
        "uuid": lambda uuid: any(uuid in (d.get("uuid"), d.get("mig_uuid")) for d in devices),
        "owner": lambda owner: group.get("owner") == owner,
        "deployment": lambda name: group.get("deployment") == name,
    }
    return all(checks[key](value) for key, value in filters.items())
