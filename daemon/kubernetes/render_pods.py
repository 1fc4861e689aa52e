"""A component's process as a pod spec: the container, its restart policy and its limits.

Rendered from the `ComponentRequest` the component would be on one box (a
deployment's component template gives one through `request`), so that the
process rules are read from one form: restart policies map to the pod's
`restartPolicy`, a time limit to `activeDeadlineSeconds`, the stop timeout
to `terminationGracePeriodSeconds`. The claims' devices reach the
containers through Grove, which adds the shared claims to every container.
"""

from __future__ import annotations

import math
from typing import Any

from computegroups.daemon.model.enums import RestartMode
from computegroups.daemon.model.requests import ComponentRequest, RestartSpec

COMPONENT_LABEL = "computegroups.io/component"
"""The pod label naming the component, which pod (anti-)affinity terms select."""
RESTART_POLICIES = {RestartMode.ALWAYS: "Always", RestartMode.ON_FAILURE: "OnFailure", RestartMode.NEVER: "Never"}
_DEFAULT_RESTART = RestartSpec()


def pod_spec(request: ComponentRequest, container: str, image: str, affinity: dict[str, Any],
             cpus: int = 0) -> dict[str, Any]:
    """The pod spec of one replica of `request`, its one container named `container` (requesting `cpus`)."""
    main: dict[str, Any] = {"name": container, "image": image}
    if cpus:
        main["resources"] = {"requests": {"cpu": str(cpus)}}
    if request.command is not None:
        main["command"] = ["/bin/sh", "-c", request.command[0]] if request.shell else list(request.command)
    if request.env:
        main["env"] = [{"name": k, "value": v} for k, v in request.env.items()]
    if request.cwd is not None:
        main["workingDir"] = request.cwd
    spec: dict[str, Any] = {
        "restartPolicy": RESTART_POLICIES[request.restart.mode],
        "terminationGracePeriodSeconds": math.ceil(request.stop_timeout_s),
    }
    if request.time_limit_s is not None:
        spec["activeDeadlineSeconds"] = math.ceil(request.time_limit_s)
    if affinity:
        spec["affinity"] = affinity
    spec["containers"] = [main]
    return spec


def process_warnings(request: ComponentRequest, path: str) -> list[str]:
    """What the component's process rules say that a pod does not carry (`path` names it in the file)."""
    out = []
    if request.command is None:
        out.append(f"{path}.command: none given: the container runs its image's own entrypoint "
                   "(on one box the component only holds its groups)")
    if request.cpu_bind is not None:
        out.append(f"{path}.cpu_bind: binding to the CPUs near the GPUs is the kubelet's CPU and topology "
                   "managers' policy on Kubernetes (static CPU manager, single-numa-node); not rendered")
    for key in ("max_retries", "backoff_s"):
        if getattr(request.restart, key) != getattr(_DEFAULT_RESTART, key):
            out.append(f"{path}.restart.{key}: the kubelet restarts containers with its own back-off and "
                       "no retry limit; not rendered")
    return out
