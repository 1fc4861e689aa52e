"""`/metrics`: what the state and the last health sample say, read at scrape time.

A custom collector rather than gauges set as things change: each scrape
derives the gauges from the state document and the health loop's latest
sample, so a gauge can never drift from the state it describes, and an
idle cgd spends nothing on metrics between scrapes. The per-GPU labels are
those of NVIDIA's DCGM exporter (`gpu`, `UUID`, `modelName`, `Hostname`,
`pci_bus_id`), so PromQL can join cgd's claims with DCGM's measurements;
every other series carries `Hostname` too, as DCGM's do, so one host
filter serves every panel.
Units are bytes, seconds and ratios (0 to 1), as Prometheus names them.
Every metric is described in docs/metrics.md.
"""

from __future__ import annotations

import platform
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from computegroups.daemon.core.views import user_name
from computegroups.daemon.model.enums import ComponentState, GroupState
from computegroups.daemon.model.refs import component_of

if TYPE_CHECKING:
    from computegroups.daemon.core.health import HealthMonitor
    from computegroups.daemon.core.manager import Manager

MIB = 1024 * 1024
GPU_LABELS = ["gpu", "UUID", "modelName", "Hostname", "pci_bus_id"]
CONTENT_TYPE = CONTENT_TYPE_LATEST


class StateCollector(Collector):
    """The gauges of one cgd, derived from its state and its health loop at each scrape."""

    def __init__(self, manager: Manager, health: HealthMonitor, version: str) -> None:
        self.manager = manager
        self.health = health
        self.version = version

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield self._build_info()
        yield from self._gpus()
        yield from self._workers()
        yield from self._counts()
        yield from self._state_files()

    def _build_info(self) -> GaugeMetricFamily:
        machine = self.manager.keeper.machine
        info = GaugeMetricFamily("computegroups_build_info", "cgd's version and what it runs on; always 1.",
                                 labels=["version", "python_version", "Hostname", "source"])
        info.add_metric([self.version, platform.python_version(), machine.hostname, machine.source], 1)
        return info

    def _gpus(self) -> Iterator[GaugeMetricFamily]:
        keeper = self.manager.keeper
        machine, doc = keeper.machine, self.manager.doc
        total = _gauge("computegroups_gpu_memory_total_bytes", "Device memory of the GPU.")
        claimed = _gauge("computegroups_gpu_memory_claimed_bytes",
                         "Device memory handed out to compute groups (what the state holds, not what is used).")
        free = _gauge("computegroups_gpu_memory_free_bytes",
                      "Device memory neither claimed nor used by foreign processes: what a new claim can get.")
        compute = _gauge("computegroups_gpu_compute_claimed_ratio",
                         "Share of the GPU's SMs handed out to compute groups (1 = all); absent for MIG GPUs.")
        used = _gauge("computegroups_gpu_memory_used_bytes", "Device memory in use, as NVML measured it "
                      "at the health loop's last sample (every process, cgd's and foreign).")
        util = _gauge("computegroups_gpu_utilization_ratio", "GPU utilization NVML measured at the last sample.")
        mem_util = _gauge("computegroups_gpu_memory_utilization_ratio",
                          "Memory (bandwidth) utilization NVML measured at the last sample.")
        temp = _gauge("computegroups_gpu_temperature_celsius", "GPU temperature at the last sample.")
        healthy = _gauge("computegroups_gpu_healthy", "1 while the health loop finds the GPU healthy, else 0.")
        drained = _gauge("computegroups_gpu_drained", "1 while the GPU is drained (gets nothing new), else 0.")
        sampled = _gauge("computegroups_gpu_last_sample_timestamp_seconds",
                         "Unix time of the health loop's last sample of the GPU.")
        claimed_mib: Counter[int] = Counter()
        compute_pct: Counter[int] = Counter()
        for g in doc.groups.values():
            for d in g.devices:
                claimed_mib[d.gpu_index] += d.memory_mib
                compute_pct[d.gpu_index] += d.compute_pct
        measured = self.health.measured()
        unhealthy = keeper.unhealthy
        drained_uuids = set(doc.drained)
        for gpu in machine.gpus:
            labels = gpu_labels(machine.hostname, gpu)
            foreign = keeper.foreign.get(gpu.index, 0)
            claimed.add_metric(labels, claimed_mib[gpu.index] * MIB)
            if gpu.memory_mib is not None:  # unknown when NVML could not say
                total.add_metric(labels, gpu.memory_mib * MIB)
                free.add_metric(labels, max(0, gpu.memory_mib - claimed_mib[gpu.index] - foreign) * MIB)
            if not gpu.mig_enabled:
                compute.add_metric(labels, min(compute_pct[gpu.index], 100) / 100)
            healthy.add_metric(labels, 0 if gpu.index in unhealthy else 1)
            drained.add_metric(labels, 1 if gpu.uuid in drained_uuids else 0)
            m = measured.get(gpu.index)
            if m is None:
                continue
            if m["memory_used_mib"] is not None:
                used.add_metric(labels, m["memory_used_mib"] * MIB)
            if m["utilization_gpu_pct"] is not None:
                util.add_metric(labels, m["utilization_gpu_pct"] / 100)
            if m["utilization_memory_pct"] is not None:
                mem_util.add_metric(labels, m["utilization_memory_pct"] / 100)
            if m["temperature_c"] is not None:
                temp.add_metric(labels, m["temperature_c"])
            if m["sampled_at"] is not None:
                sampled.add_metric(labels, m["sampled_at"])
        yield from (total, claimed, free, compute, used, util, mem_util, temp, healthy, drained, sampled)

    def _workers(self) -> Iterator[GaugeMetricFamily]:
        """Measured memory per worker and GPU."""
        machine, doc = self.manager.keeper.machine, self.manager.doc
        names = ["component", "replica", "user"]
        used = GaugeMetricFamily("computegroups_worker_gpu_memory_used_bytes", "Device memory a worker "
                                 "(with its children) used on the GPU at the health loop's last sample.",
                                 labels=[*names, *GPU_LABELS])
        known = {g.index: g for g in machine.gpus}
        for index, by_ref in sorted(self.health.used_by_replica().items()):
            gpu = known.get(index)
            if gpu is None:
                continue  # NVML lists a GPU discovery did not: not one cgd manages, and no reason to fail a scrape
            for ref, mib in sorted(by_ref.items()):
                comp = doc.components.get(component_of(ref))
                user = user_name(comp.owner_uid) if comp is not None else ""
                used.add_metric([component_of(ref), ref.rpartition("/")[2], user,
                                 *gpu_labels(machine.hostname, gpu)], mib * MIB)
        yield used

    def _counts(self) -> Iterator[GaugeMetricFamily]:
        doc = self.manager.doc
        host = self.manager.keeper.machine.hostname
        groups = GaugeMetricFamily("computegroups_groups", "Compute groups by state.", labels=["Hostname", "state"])
        by_group = Counter(str(g.state) for g in doc.groups.values())
        for state in GroupState:
            groups.add_metric([host, str(state)], by_group.get(str(state), 0))
        components = GaugeMetricFamily("computegroups_components", "Components by state.",
                                       labels=["Hostname", "state"])
        by_comp = Counter(str(c.state) for c in doc.components.values())
        for name in (str(s) for s in ComponentState):
            components.add_metric([host, name], by_comp.get(name, 0))
        expected, running = self.manager.worker_counts()
        workers = GaugeMetricFamily("computegroups_workers", "Workers that should be running, and those of "
                                    "them running.", labels=["Hostname", "state"])
        workers.add_metric([host, "expected"], expected)
        workers.add_metric([host, "running"], running)
        generation = GaugeMetricFamily("computegroups_state_generation", "Generation of the state document "
                                       "(one more per commit).", labels=["Hostname"])
        generation.add_metric([host], doc.generation)
        events = GaugeMetricFamily("computegroups_events_last_seq", "Sequence number of the last event emitted.",
                                   labels=["Hostname"])
        events.add_metric([host], self.manager.keeper.events.last_seq)
        yield from (groups, components, workers, generation, events)

    def _state_files(self) -> Iterator[GaugeMetricFamily]:
        sizes = GaugeMetricFamily("computegroups_state_file_bytes", "Size of the state files on disk: the "
                                  "journal (replayed at start) and the last snapshot.", labels=["Hostname", "file"])
        host = self.manager.keeper.machine.hostname
        directory = self.manager.keeper.store.directory
        for label, name in (("journal", "state.journal"), ("snapshot", "state.json")):
            try:
                sizes.add_metric([host, label], (directory / name).stat().st_size)
            except OSError:
                sizes.add_metric([host, label], 0)
        yield sizes
        writable = GaugeMetricFamily("computegroups_state_writable", "1 while cgd can make changes to its state "
                                     "durable; 0 after an fsync failed: every change is refused until cgd "
                                     "restarts (GET /v1/health says why).", labels=["Hostname"])
        writable.add_metric([host], 0 if self.manager.keeper.refusal else 1)
        yield writable


def _gauge(name: str, documentation: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=GPU_LABELS)


def gpu_labels(hostname: str, gpu) -> list[str]:
    return [str(gpu.index), gpu.uuid, gpu.name, hostname, gpu.pci_bus_id]


def exposition(registry) -> bytes:
    """The text format Prometheus scrapes."""
    return generate_latest(registry)
