"""Every cgd route, written once for both the blocking and the async client.

`cgctl` wants a blocking client that starts fast; `ComputeGroupManager` wants
an async one. Both inherit these methods and differ only in `send`, so a route
(its method, its quoting, its query) cannot drift between the two: on
`CgdClient` a method returns the decoded answer, on `AsyncCgdClient` an
awaitable of it.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlencode

from computegroups.daemon.client.wire import Request

R = TypeVar("R")
Json = Any


def _seg(value: str | int) -> str:
    """One path segment; a name with a slash must not reach another route."""
    return quote(str(value), safe="")


def _with_query(path: str, **params: str | int | bool | None) -> str:
    kept = {k: (str(v).lower() if isinstance(v, bool) else str(v))
            for k, v in params.items() if v is not None}
    return f"{path}?{urlencode(kept)}" if kept else path


def events_request(since: int | None = None, follow: bool = True) -> Request:
    """`GET /v1/events`: the one streamed route, so each client reads it its own way (`events`)."""
    return Request("GET", _with_query("/v1/events", since=since, follow=follow))


def with_caller_path(body: Mapping[str, Json], environ: Mapping[str, str] = os.environ) -> dict[str, Json]:
    """`body` with the caller's PATH in its `env`, as cgctl sends it: a worker runs as the caller
    and finds the programs (a venv's `python`) the caller would. Not when the request sets PATH
    itself, runs no command, or the caller has no PATH (cgd's default stays)."""
    env = body.get("env") or {}
    if not body.get("command") or "PATH" in env or "PATH" not in environ:
        return dict(body)
    return {**body, "env": {**env, "PATH": environ["PATH"]}}


class Endpoints(ABC, Generic[R]):
    """The routes of docs/api.md; subclasses decide how a `Request` travels."""

    @abstractmethod
    def send(self, request: Request) -> R:
        """Carry one request to cgd; answer its decoded JSON or raise a ClientError."""

    def version(self) -> R:
        return self.send(Request("GET", "/v1/version"))

    def machine(self) -> R:
        return self.send(Request("GET", "/v1/machine"))

    def status(self) -> R:
        return self.send(Request("GET", "/v1/status"))

    def health(self) -> R:
        return self.send(Request("GET", "/v1/health"))

    def acknowledge_state_loss(self) -> R:
        return self.send(Request("POST", "/v1/state/acknowledge-loss"))

    def create_component(self, body: dict[str, Json]) -> R:
        """A component with a command gets the caller's PATH unless its `env` sets one (see
        `with_caller_path`)."""
        return self.send(Request("POST", "/v1/components", with_caller_path(body)))

    def list_components(self, owner: int | None = None) -> R:
        return self.send(Request("GET", _with_query("/v1/components", owner=owner)))

    def get_component(self, name: str) -> R:
        return self.send(Request("GET", f"/v1/components/{_seg(name)}"))

    def release_component(self, name: str, stop_timeout: float | None = None) -> R:
        timeout = None if stop_timeout is None else f"{stop_timeout:g}"
        return self.send(Request("DELETE", _with_query(f"/v1/components/{_seg(name)}", stop_timeout=timeout)))

    def release_components(self, names: list[str], stop_timeout: float | None = None) -> R:
        """Components and reservations in one request: cgd checks every name before it releases any."""
        if not names:
            raise ValueError("release_components: name at least one component or reservation")
        timeout = None if stop_timeout is None else f"{stop_timeout:g}"
        query = urlencode([("name", n) for n in names] + ([("stop_timeout", timeout)] if timeout else []))
        return self.send(Request("DELETE", f"/v1/components?{query}"))

    def release_all(self) -> R:
        return self.send(Request("DELETE", _with_query("/v1/components", all=True)))

    def wait_component(self, name: str, until: str = "ended", timeout: float = 30.0) -> R:
        """One long poll: `{"reached", "component"}` once the component is placed or has ended, or at `timeout`."""
        return self.send(Request("GET", _with_query(f"/v1/components/{_seg(name)}/wait", until=until,
                                                    timeout=f"{timeout:g}")))

    def scale_component(self, name: str, replicas: int) -> R:
        return self.send(Request("POST", f"/v1/components/{_seg(name)}/scale", {"replicas": replicas}))

    def restart_component(self, name: str, replica: int | None = None) -> R:
        body = {} if replica is None else {"replica": replica}
        return self.send(Request("POST", f"/v1/components/{_seg(name)}/restart", body))

    def component_env(self, name: str, replica: int | None = None) -> R:
        return self.send(Request("GET", _with_query(f"/v1/components/{_seg(name)}/env", replica=replica)))

    def component_logs(
        self, name: str, replica: int | None = None, stream: str | None = None,
        tail: int | None = None, offset: int | None = None,
    ) -> R:
        path = _with_query(f"/v1/components/{_seg(name)}/logs",
                           replica=replica, stream=stream, tail=tail, offset=offset)
        return self.send(Request("GET", path))

    def list_groups(self, component: str | None = None, state: str | None = None,
                    gpu: int | None = None, *, model: str | None = None, pool: str | None = None,
                    uuid: str | None = None, owner: str | None = None, deployment: str | None = None) -> R:
        return self.send(Request("GET", _with_query(
            "/v1/groups", component=component, state=state, gpu=gpu, model=model, pool=pool, uuid=uuid,
            owner=owner, deployment=deployment)))

    def get_group(self, group_id: str) -> R:
        return self.send(Request("GET", f"/v1/groups/{_seg(group_id)}"))

    def create_group(self, claim: dict[str, Json]) -> R:
        return self.send(Request("POST", "/v1/groups", {"claim": claim}))

    def delete_group(self, group_id: str) -> R:
        return self.send(Request("DELETE", f"/v1/groups/{_seg(group_id)}"))

    def deallocate_group(self, group_id: str) -> R:
        return self.send(Request("POST", f"/v1/groups/{_seg(group_id)}/deallocate"))

    def drain_group(self, group_id: str) -> R:
        return self.send(Request("POST", f"/v1/groups/{_seg(group_id)}/drain"))

    def undrain_group(self, group_id: str) -> R:
        return self.send(Request("POST", f"/v1/groups/{_seg(group_id)}/undrain"))

    def drain_gpu(self, index: int, drained: bool = True) -> R:
        verb = "drain" if drained else "undrain"
        return self.send(Request("POST", f"/v1/gpus/{_seg(index)}/{verb}"))

    def apply_deployment(self, body: dict[str, Json]) -> R:
        """`body` as `deployfile.load_deployment` makes it: `spec`, `source`, `included`."""
        return self.send(Request("POST", "/v1/deployments", body))

    def create_reservation(self, body: dict[str, Json]) -> R:
        return self.send(Request("POST", "/v1/reservations", body))

    def list_reservations(self) -> R:
        return self.send(Request("GET", "/v1/reservations"))

    def delete_reservation(self, name: str) -> R:
        return self.send(Request("DELETE", f"/v1/reservations/{_seg(name)}"))
