"""An emulated Kubernetes API on a real port, and the test in the scheduler's seat.

kmock's `KubernetesEmulator` keeps objects in memory and serves them over
HTTP as an API server does; `ClusterEmulator` adds what the provider relies
on that it lacks (label selectors on lists, server-side apply creating an
object, creation metadata, a delete's uid precondition) and an API server's
watch: every change, whoever makes it (a request, or the test's scheduler),
gets the next `resourceVersion` and is kept, so a watch resumes after a
version, filters by label, and answers 410 Gone (an `ERROR` event, as the
API server streams it) for a version older than what is kept (`compact`). It runs on its own event loop in a thread, so
the provider under test (or `cgctl` in a subprocess) talks to it over real
HTTP exactly as to a cluster.

`EmulatedCluster.scheduling` says what the test's scheduler does with a
holder pod's claim: `"allocate"` writes `status.allocation` from the free
devices of the ResourceSlices (as kube-scheduler's DRA plugin does), and
`"hold"` leaves it unallocated with the pod's PodScheduled condition and a
FailedScheduling event giving the reason.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import threading
import uuid
from collections.abc import Callable, Coroutine, Mapping
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import aiohttp.web
import attrs
from kmock import KubernetesEmulator, ResourceInfo, Server, resource
from kmock._internal.k8s import KubernetesError
from lightkube.utils.quantity import parse_quantity

T = TypeVar("T")
NAMESPACE = "cg-test"
DRIVER = "gpu.nvidia.com"
MIB = 1024 * 1024
PROTECTION = "resource.kubernetes.io/delete-protection"
"""The finalizer an allocated claim carries, so it outlives no pod that uses it."""
HOLD_REASON = "0/1 nodes are available: 1 cannot allocate all claims. preemption: 0/1 nodes are available."

CLAIMS = resource(group="resource.k8s.io", version="v1", plural="resourceclaims")
SLICES = resource(group="resource.k8s.io", version="v1", plural="resourceslices")
PODS = resource(group="", version="v1", plural="pods")
NODES = resource(group="", version="v1", plural="nodes")
EVENTS = resource(group="", version="v1", plural="events")
PCS = resource(group="grove.io", version="v1alpha1", plural="podcliquesets")
TEMPLATES = resource(group="resource.k8s.io", version="v1", plural="resourceclaimtemplates")
KINDS = {CLAIMS: ("ResourceClaim", True), SLICES: ("ResourceSlice", False), PODS: ("Pod", True),
         NODES: ("Node", False), EVENTS: ("Event", True), PCS: ("PodCliqueSet", True),
         TEMPLATES: ("ResourceClaimTemplate", True)}


def _mib(quantity: str) -> int:
    return int((parse_quantity(quantity) or 0) // MIB)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _matches(labels: Mapping[str, str], selector: str) -> bool:
    """`k=v`, `k!=v`, `k` and `!k` terms, comma-separated: the forms clients send."""
    for term in filter(None, selector.split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _allocated_node(claim: Mapping[str, Any]) -> str | None:
    """The node an allocated claim's devices are on (its allocation's node selector), None before."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    for term in (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name":
                return str(field["values"][0])
    return None


def write_kubeconfig(path: Path, server: str, namespace: str = NAMESPACE) -> Path:
    """A kubeconfig (JSON is YAML) whose one context, `emulated`, is `server` and `namespace`."""
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulated",
        "clusters": [{"name": "emulated", "cluster": {"server": server}}],
        "users": [{"name": "tester", "user": {"token": "emulated"}}],
        "contexts": [{"name": "emulated",
                      "context": {"cluster": "emulated", "user": "tester", "namespace": namespace}}],
    }))
    return path


@attrs.frozen
class PreconditionFailed(KubernetesError):
    """A delete whose `preconditions.uid` names another object of that name (the API server's 409)."""
    status: int = 409
    reason: str = "Conflict"
    message: str = "Precondition failed: UID in precondition does not match the object's"


class ClusterEmulator(KubernetesEmulator):
    """kmock's emulator, with label selectors, apply-creates, creation metadata,
    delete preconditions, and a watch that resumes by `resourceVersion`."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.revision = 0
        """The last resourceVersion given: one counter for every kind, as etcd's revision is."""
        self.history: list[tuple[int, Any, str, dict[str, Any]]] = []
        """(resourceVersion, resource, ADDED/MODIFIED/DELETED, the object then): the watch cache."""
        self.compacted = 0
        """Versions up to this one are no longer kept: a watch from before it is 410 Gone."""
        self._seen: dict[tuple[Any, str | None, str], str] = {}
        self._changed = asyncio.Condition(self._lock)

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        if request.resource is not None and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            if request.action == "CREATE" or self._applies_new(request):
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", _now())
                if request.namespace:
                    meta.setdefault("namespace", request.namespace)
            if self._applies_new(request):
                async with self._lock:
                    self._objects[(request.resource, request.namespace, request.name)] = request.data
            if request.action == "DELETE":
                await self._check_precondition(request)
        try:
            return await super()._handle(request)
        finally:
            async with self._lock:
                self.record()

    async def _check_precondition(self, request: Any) -> None:
        uid = ((request.data.get("preconditions") or {}).get("uid"))
        if uid is None:
            return
        async with self._lock:
            key = (request.resource, request.namespace, request.name)
            found = self._objects[key] if key in self._objects else None  # noqa: SIM401 (ObjectsArray has no get)
            if found is not None and not found.deleted and found.get("metadata", {}).get("uid") != uid:
                raise PreconditionFailed()

    def record(self) -> None:
        """Give every change since the last call its resourceVersion and keep it (call under the lock).

        The changes are found by comparing each object with what was seen, so the test's scheduler
        writing objects directly is watched as a controller's requests would be."""
        now: dict[tuple[Any, str | None, str], Any] = {
            key: obj for key, obj in self._objects.items() if not obj.deleted}
        changes: list[tuple[tuple[Any, str | None, str], str, Any]] = []
        for key, obj in now.items():
            body = self._body(obj.raw)
            if self._seen.get(key) != body:
                changes.append((key, "ADDED" if key not in self._seen else "MODIFIED", obj))
                self._seen[key] = body
        for key in [key for key in self._seen if key not in now]:
            del self._seen[key]
            gone = self._objects[key] if key in self._objects else None  # noqa: SIM401 (ObjectsArray has no get)
            changes.append((key, "DELETED", gone))
        for key, kind, obj in changes:
            self.revision += 1
            if obj is None:
                continue
            if kind == "DELETED":
                raw = json.loads(json.dumps(obj.last.raw))
            else:
                obj.patch({"metadata": {"resourceVersion": str(self.revision)}})
                self._seen[key] = self._body(obj.raw)
                raw = json.loads(json.dumps(obj.raw))
            raw.setdefault("metadata", {})["resourceVersion"] = str(self.revision)
            self.history.append((self.revision, key[0], kind, raw))
        if changes:
            self._changed.notify_all()

    @staticmethod
    def _body(raw: Mapping[str, Any]) -> str:
        meta = {k: v for k, v in (raw.get("metadata") or {}).items() if k != "resourceVersion"}
        return json.dumps({**raw, "metadata": meta}, sort_keys=True)

    def _past(self, version: int) -> bool:
        return self.revision > version

    def compact(self) -> None:
        """Forget every change kept so far, as the API server's bounded watch cache does (call under the lock)."""
        self.compacted = self.revision
        self.history.clear()

    def _applies_new(self, request: Any) -> bool:
        """A server-side apply of an object that is not there creates it, as on a real API server."""
        if request.method != "PATCH" or "apply-patch" not in request.headers.get("Content-Type", ""):
            return False
        key = (request.resource, request.namespace, request.name)
        return key not in self._objects or self._objects[key].deleted

    async def _serve_list(self, request: Any) -> Any:
        answer: Any = await super()._serve_list(request)
        wanted = request.params.get("labelSelector")
        if wanted:
            answer["items"] = [o for o in answer["items"]
                               if _matches((o.get("metadata") or {}).get("labels") or {}, wanted)]
        answer["metadata"]["resourceVersion"] = str(self.revision)
        return answer

    def _watched(self, request: Any, res: Any, raw: Mapping[str, Any]) -> bool:
        meta = raw.get("metadata") or {}
        wanted = request.params.get("labelSelector")
        return res == request.resource and request.namespace in (None, meta.get("namespace")) \
            and (not wanted or _matches(meta.get("labels") or {}, wanted))

    async def _serve_watch(self, request: Any) -> Any:
        """The API server's watch: from `resourceVersion` (exclusive) on, or (none, or "0") every
        object as it is now (ADDED), then each change as it is made."""
        yield b""
        since = request.params.get("resourceVersion")
        async with self._lock:
            if since in (None, "", "0"):
                after = self.revision
                first = [{"type": "ADDED", "object": json.loads(json.dumps(obj.raw))}
                         for (res, _, _), obj in self._objects.items()
                         if not obj.deleted and self._watched(request, res, obj.raw)]
            elif int(since) < self.compacted:
                first = [{"type": "ERROR", "object": {
                    "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                    "reason": "Expired", "code": 410,
                    "message": f"too old resource version: {since} ({self.compacted})"}}]
                after = -1
            else:
                after, first = int(since), []
        for event in first:
            yield event
        while after >= 0:
            async with self._changed:
                await self._changed.wait_for(partial(self._past, after))
                new = [(rv, res, kind, raw) for rv, res, kind, raw in self.history if rv > after]
                after = self.revision
            for _, res, kind, raw in new:
                if self._watched(request, res, raw):
                    yield {"type": kind, "object": raw}


class EmulatedCluster:
    """The emulator on 127.0.0.1, its GPU nodes (NVIDIA DRA ResourceSlices) and the test's scheduler."""

    def __init__(self, nodes: Mapping[str, int] | None = None, *, memory_mib: int = 81559,
                 product: str = "NVIDIA H100 80GB HBM3", products: Mapping[str, str] | None = None,
                 taint_api: str | None = "v1", shareable: bool = True) -> None:
        self.nodes = dict(nodes or {"dgx-h100": 8})
        self.memory_mib = memory_mib
        self.product = product
        self.shareable = shareable
        """False: devices as NVIDIA's driver publishes them today, not shareable (no consumable capacity)."""
        self.products = dict(products or {})
        """node -> the GPU model of its devices, where it is not `product`."""
        self.taint_api = taint_api
        self.taints = resource(group="resource.k8s.io", version=taint_api or "v1", plural="devicetaintrules")
        self.scheduling = "allocate"
        self.hold_reason = HOLD_REASON
        self.claim_controller = True
        """False: deleted claims keep their finalizer (a slow controller), until set back."""
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="emulated-cluster", daemon=True)
        self.emulator: ClusterEmulator | None = None
        self.failure: BaseException | None = None

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> EmulatedCluster:
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("the emulated cluster did not start")
        if self.failure is not None:
            raise RuntimeError("the emulated cluster failed to start") from self.failure
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(20)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # shown by start() or the test's assertions
            self.failure = exc
            self._ready.set()
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with ClusterEmulator() as emulator, Server(emulator) as server:
            self.emulator = emulator
            kinds = dict(KINDS)
            if self.taint_api is not None:
                kinds[self.taints] = ("DeviceTaintRule", False)
            for res, (kind, namespaced) in kinds.items():
                emulator.resources[res] = ResourceInfo(kind=kind, namespaced=namespaced,
                                                        verbs={"list", "get", "create", "delete", "patch", "watch"})
            self._seed(emulator)
            async with emulator._lock:
                emulator.record()
            self.url = str(server.url).rstrip("/")
            scheduler = asyncio.ensure_future(self._schedule_forever())
            self._ready.set()
            await self._stop.wait()
            scheduler.cancel()

    def _seed(self, emulator: ClusterEmulator) -> None:
        for node, count in self.nodes.items():
            emulator.objects[NODES, None, node] = {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
            emulator.objects[SLICES, None, f"{node}-gpu.nvidia.com"] = self.slice(node, count)

    def slice(self, node: str, count: int) -> dict[str, Any]:
        """A ResourceSlice as NVIDIA's DRA driver publishes it, its devices shareable (KEP-5075)."""
        return {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-gpu.nvidia.com"},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{
                         "name": f"gpu-{i}", "allowMultipleAllocations": self.shareable,
                         "attributes": {"type": {"string": "gpu"},
                                        "uuid": {"string": f"GPU-{node}-{i:04d}"},
                                        "productName": {"string": self.products.get(node, self.product)},
                                        "brand": {"string": "Nvidia"}, "architecture": {"string": "Hopper"},
                                        "cudaComputeCapability": {"version": "9.0.0"},
                                        "driverVersion": {"version": "580.65.6"}},
                         "capacity": {"memory": {"value": str(self.memory_mib * MIB)}}}
                         for i in range(count)]},
        }

    # -- what tests read -------------------------------------------------------

    def call(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(20)

    def objects(self, res: Any) -> list[dict[str, Any]]:
        """The live objects of one resource, as the API server holds them now."""
        async def read() -> list[dict[str, Any]]:
            assert self.emulator is not None
            async with self.emulator._lock:
                return [json.loads(json.dumps(obj.raw)) for (r, _, _), obj in self.emulator.objects.items()
                        if r == res and not obj.deleted]
        return self.call(read)

    def requests(self) -> list[tuple[str, str]]:
        """(method, path) of every request the API server has had."""
        async def read() -> list[tuple[str, str]]:
            assert self.emulator is not None
            return [(str(r.method.value), r.url.path) for r in self.emulator]
        return self.call(read)

    def kubeconfig(self, path: Path, namespace: str = NAMESPACE) -> Path:
        return write_kubeconfig(path, self.url, namespace)

    # -- the scheduler -----------------------------------------------------------

    async def _schedule_forever(self) -> None:
        while True:
            assert self.emulator is not None
            async with self.emulator._lock:
                self._schedule_once(self.emulator)
                self.emulator.record()
            await asyncio.sleep(0.01)

    def _live(self, emulator: ClusterEmulator, res: Any) -> dict[tuple[str | None, str], Any]:
        return {(ns, name): obj for (r, ns, name), obj in emulator.objects.items() if r == res and not obj.deleted}

    def _schedule_once(self, emulator: ClusterEmulator) -> None:
        self._release_deleted_claims(emulator)
        claims = self._live(emulator, CLAIMS)
        for (ns, name), pod in self._live(emulator, PODS).items():
            if pod.get("spec", {}).get("nodeName"):
                continue
            refs = pod.get("spec", {}).get("resourceClaims") or []
            wanted = [claims.get((ns, r.get("resourceClaimName"))) for r in refs]
            if not wanted or any(c is None for c in wanted):
                continue
            placed = self._allocate(emulator, [c for c in wanted if c is not None], pod) \
                if self.scheduling == "allocate" else None
            if placed is None:
                self._unschedulable(emulator, ns, name, pod)
                continue
            for claim in wanted:
                assert claim is not None
                user = {"resource": "pods", "name": name, "uid": pod["metadata"].get("uid")}
                if not claim.get("status", {}).get("allocation"):
                    claim.patch({"metadata": {"finalizers": [PROTECTION]},
                                 "status": {"allocation": placed[claim["metadata"]["name"]],
                                            "reservedFor": [user]}})
                else:  # an allocated claim is shared by every pod that references it
                    claim.patch({"status": {"reservedFor": [*claim["status"].get("reservedFor", []), user]}})
            pod.patch({"spec": {"nodeName": placed["node"]}, "status": {"phase": "Running", "conditions": [
                {"type": "PodScheduled", "status": "True"}]}})

    def _release_deleted_claims(self, emulator: ClusterEmulator) -> None:
        """kube-controller-manager's part: a deleted claim that no pod uses any more loses its
        delete-protection finalizer and goes; until then it is there, `deletionTimestamp` set."""
        if not self.claim_controller:
            return
        used = {(ns, r.get("resourceClaimName")) for (ns, _), pod in self._live(emulator, PODS).items()
                for r in pod.get("spec", {}).get("resourceClaims") or []}
        for key, claim in self._live(emulator, CLAIMS).items():
            if claim.get("metadata", {}).get("deletionTimestamp") and key not in used:
                claim.delete()

    def _used(self, emulator: ClusterEmulator) -> dict[tuple[str, str], list[int | None]]:
        """(pool, device) -> the memory each allocation takes of it (None: all of it)."""
        used: dict[tuple[str, str], list[int | None]] = {}
        for claim in self._live(emulator, CLAIMS).values():
            for r in ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", []):
                memory = (r.get("consumedCapacity") or {}).get("memory")
                used.setdefault((r["pool"], r["device"]), []).append(_mib(memory) if memory else None)
        return used

    def _tainted(self, emulator: ClusterEmulator) -> set[tuple[str, str]]:
        if self.taint_api is None:
            return set()
        return {(r["spec"]["deviceSelector"]["pool"], r["spec"]["deviceSelector"]["device"])
                for r in self._live(emulator, self.taints).values()}

    def _allocate(self, emulator: ClusterEmulator, claims: list[Any], pod: Any) -> dict[str, Any] | None:
        used, tainted = self._used(emulator), self._tainted(emulator)
        pinned = (pod.get("spec", {}).get("nodeSelector") or {}).get("kubernetes.io/hostname")
        bound = {_allocated_node(c) for c in claims} - {None}
        for node, count in self.nodes.items():
            if pinned not in (None, node) or bound - {node}:  # a pod goes where its allocated claims are
                continue
            free = [f"gpu-{i}" for i in range(count) if (node, f"gpu-{i}") not in tainted]
            taken: dict[str, list[int | None]] = {d: list(used.get((node, d), [])) for d in free}
            placed: dict[str, Any] = {"node": node}
            for claim in claims:
                if claim.get("status", {}).get("allocation"):
                    continue
                results: list[dict[str, Any]] = []
                for request in claim["spec"]["devices"]["requests"]:
                    if not self._take(request, node, free, taken, results):
                        break
                else:
                    placed[claim["metadata"]["name"]] = {
                        "devices": {"results": results},
                        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}
                    continue
                break
            else:
                return placed
        return None

    def _take(self, request: Mapping[str, Any], node: str, free: list[str], taken: dict[str, list[int | None]],
              results: list[dict[str, Any]]) -> bool:
        """Serve one request on `node`: `exactly`, or the first of its `firstAvailable` subrequests that
        fits (DRA's prioritized list; the result names `request/subrequest`). A capacity request needs
        shareable devices (`shareable`), as KEP-5075 does."""
        options = [(request["name"], request["exactly"])] if "exactly" in request else [
            (f"{request['name']}/{sub['name']}", sub) for sub in request["firstAvailable"]]
        for name, exactly in options:
            capacity = (exactly.get("capacity") or {}).get("requests", {})
            if capacity and not self.shareable:
                continue
            want = _mib(capacity["memory"]) if "memory" in capacity else None
            fits = [d for d in free if not taken[d]] if want is None else [
                d for d in free if None not in taken[d] and sum(taken[d]) + want <= self.memory_mib]  # type: ignore[arg-type]
            if len(fits) < exactly.get("count", 1):
                continue
            for device in fits[:exactly.get("count", 1)]:
                taken[device].append(want)
                result = {"request": name, "driver": DRIVER, "pool": node, "device": device}
                if capacity:  # KEP-5075: what the claim took of a shared device
                    result["consumedCapacity"] = dict(capacity)
                    result["shareID"] = str(uuid.uuid4())
                results.append(result)
            return True
        return False

    def _unschedulable(self, emulator: ClusterEmulator, ns: str | None, name: str, pod: Any) -> None:
        conditions = pod.get("status", {}).get("conditions") or []
        if any(c.get("message") == self.hold_reason for c in conditions):
            return
        pod.patch({"status": {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": self.hold_reason}]}})
        event = f"{name}.{uuid.uuid4().hex[:8]}"
        emulator.objects[EVENTS, ns, event] = {
            "apiVersion": "v1", "kind": "Event", "type": "Warning", "reason": "FailedScheduling",
            "message": self.hold_reason, "metadata": {"name": event, "namespace": ns},
            "involvedObject": {"kind": "Pod", "name": name, "namespace": ns}}
