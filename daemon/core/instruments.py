"""What cgd counts and times as it runs: the process metrics of `/metrics`.

Counters and histograms live in this process and start from zero at each
start, as Prometheus expects of a process's counters (`rate()` handles the
reset). They are fed from the event bus where an event says it all (a
worker started, a promotion) and timed where the work is done (a
placement, a commit, an fsync). What the state says now (groups by state,
memory claimed) is not counted here: `metrics.StateCollector` reads it at
scrape time, so no gauge can drift from the state.

Each cgd has its own registry, never prometheus_client's global one: tests
start several daemons' worth of parts in one process, and nothing else of
the process's (its Python GC, say) is cgd's to export.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics

from computegroups.daemon.core.eventlog import Event

# No `*_created` series beside each counter and histogram: they double what a scrape
# carries and say only when cgd started, which `process_start_time_seconds` style
# dashboards do not need here. (A process-wide switch of prometheus_client.)
disable_created_metrics()

FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Placements and commits: sub-millisecond to a slow disk's seconds."""
PROMOTION = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Instruments:
    """The counters and histograms of one cgd, in their own registry.

    Each carries `Hostname`, as every series of cgd's (and of NVIDIA's DCGM exporter) does: a
    dashboard picks a host by it whatever the scrape's `instance` label says."""

    def __init__(self, registry: CollectorRegistry | None = None, hostname: str = "") -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry()
        self.hostname = hostname
        host = ["Hostname"]
        self.allocations = Counter(
            "computegroups_allocations", "Claims decided, by result: granted (placed at once, or "
            "later from the queue; attaching to groups already held places nothing and is not counted), "
            "queued (waiting for capacity) or refused (does not fit).",
            [*host, "result"], registry=r)
        self.decision_seconds = Histogram(
            "computegroups_allocation_decision_seconds", "Time the placement engine took to decide one "
            "claim (granted or refused).", host, buckets=FAST, registry=r).labels(hostname)
        self.allocation_commit_seconds = Histogram(
            "computegroups_allocation_commit_seconds", "Time from the start of an allocation's transaction "
            "to its change being durable on disk (decision, journal write and fsync).", host, buckets=FAST,
            registry=r).labels(hostname)
        self.state_commit_seconds = Histogram(
            "computegroups_state_commit_seconds", "Time one state transaction took to validate its change "
            "and append it to the journal (the fsync is apart).", host, buckets=FAST, registry=r).labels(hostname)
        self.state_sync_seconds = Histogram(
            "computegroups_state_sync_seconds", "Time one fsync of the state took (shared by every "
            "commit made while it ran).", host, buckets=FAST, registry=r).labels(hostname)
        self.worker_starts = Counter(
            "computegroups_worker_starts", "Worker processes started (first starts and restarts).", host,
            registry=r).labels(hostname)
        self.worker_exits = Counter(
            "computegroups_worker_exits", "Workers that ended without cgd asking, by cause: exit_zero, "
            "exit_nonzero, signal, unknown.", [*host, "cause"], registry=r)
        self.worker_restarts = Counter(
            "computegroups_worker_restarts", "Restarts cgd decided after a worker ended.", host,
            registry=r).labels(hostname)
        self.promotions = Counter(
            "computegroups_shadow_promotions", "Shadows promoted to primary.", host, registry=r).labels(hostname)
        self.promotion_seconds = Histogram(
            "computegroups_shadow_promotion_seconds", "Time from a primary's exit being reported to its "
            "shadow being signalled.", host, buckets=PROMOTION, registry=r).labels(hostname)
        self.health_events = Counter(
            "computegroups_gpu_health_events", "Health events seen by the health loop, by GPU and kind: "
            "xid (a critical Xid), ecc (new uncorrected ECC errors), lost, temperature, remapped_rows.",
            ["gpu", "UUID", "modelName", "Hostname", "pci_bus_id", "kind"], registry=r)
        self.events = Counter(
            "computegroups_events", "Events emitted on the event stream, by type.", [*host, "type"], registry=r)
        for result in ("granted", "queued", "refused"):
            self.allocations.labels(hostname, result)
        for cause in ("exit_zero", "exit_nonzero", "signal", "unknown"):
            self.worker_exits.labels(hostname, cause)

    def granted(self, claims: int) -> None:
        """Claims a commit placed (the keeper counts its placements: an `allocated` event is also
        told for shadows and sharers, which place nothing, and for a restored document)."""
        if claims:
            self.allocations.labels(self.hostname, "granted").inc(claims)

    def count(self, event: Event) -> None:
        """Subscribed to the event bus: the counters an event makes."""
        kind = event["type"]
        self.events.labels(self.hostname, kind).inc()
        if kind in ("queued", "refused"):
            self.allocations.labels(self.hostname, kind).inc()
        elif kind == "worker_started":
            self.worker_starts.inc()
        elif kind == "restarted":
            self.worker_restarts.inc()
        elif kind == "promoted":
            self.promotions.inc()
        elif kind == "worker_exited":
            self.worker_exits.labels(self.hostname, exit_cause(event)).inc()


def exit_cause(event: Event) -> str:
    if event.get("signal"):
        return "signal"
    code = event.get("exit_code")
    if code is None:
        return "unknown"
    return "exit_zero" if code == 0 else "exit_nonzero"
