"""cgd's configuration file (TOML), validated once at start-up.

A mistake in the file must stop cgd with the file, the key and the problem
named: a daemon that starts with a silently ignored pool or threshold hands
out GPUs under rules its operator did not write. The file is declared as
msgspec structs, one per section (`ConfigFile`), so types, bounds, choices
and unknown keys are checked as it is read; `DaemonConfig` is what the rest of
cgd reads, derived from it once.
"""

from __future__ import annotations

import signal
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from computegroups.daemon.model.claims import AllocatorConfig, Strategy, parse_size
from computegroups.daemon.model.decoding import ModelError, convert
from computegroups.daemon.model.sharepolicy import SharingTable

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DEFAULT_CRITICAL_XIDS = (48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120)

PositiveInt = Annotated[int, Meta(ge=1)]
Pool = Annotated[list[Annotated[int, Meta(ge=0)]], Meta(min_length=1)]
"""The GPU indices of one named pool."""


class ConfigError(ValueError):
    """The configuration file is wrong; the message names file and key."""


class ShareEnforcement(str, Enum):
    """What cgd does when a worker uses more memory than its share."""

    REPORT = "report"
    STOP = "stop"


class DeviceNaming(str, Enum):
    """How CUDA_VISIBLE_DEVICES names whole GPUs (MIG devices are always `MIG-` UUIDs)."""

    INDICES = "indices"
    UUID = "uuid"


class WorkerTracking(str, Enum):
    """How cgd finds everything a worker started (see daemon/supervision/cgroups.py): a cgroup v2
    per worker where cgd can write one (`auto` falls back to marks where it cannot; `cgroup`
    refuses to start then), or only the processes carrying the worker's environment marks."""

    AUTO = "auto"
    CGROUP = "cgroup"
    MARKS = "marks"


class CpuBindDefault(str, Enum):
    """Workers' CPU binding when their component does not say: `auto` binds to the GPUs' NUMA-local
    CPUs on a machine with more than one NUMA node, and not at all on one with a single node."""

    AUTO = "auto"
    NUMA = "numa"
    NONE = "none"


class _Section(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A table of the file: a misspelt key stops cgd rather than doing nothing."""


class HealthConfig(_Section, frozen=True, kw_only=True):
    """The `[health]` table, read as is by the health loop."""

    interval_s: float = 2.0
    max_temperature_c: PositiveInt = 90
    critical_xids: tuple[int, ...] = DEFAULT_CRITICAL_XIDS
    drain_on_ecc: bool = True

    def __post_init__(self) -> None:
        if not self.interval_s > 0:
            raise ValueError(f"interval_s: expected a positive number of seconds, got {self.interval_s:g}")


class Placement(_Section, frozen=True, kw_only=True):
    default_strategy: Strategy = Strategy.BINPACK
    default_share: str | None = None

    def share(self) -> tuple[int | None, float]:
        """(MiB, fraction) for a share asked without memory: '10GiB' sets the first, '25%' the second."""
        fraction = AllocatorConfig().default_share_fraction
        text = self.default_share
        if text is None:
            return None, fraction
        if not text.strip().endswith("%"):
            try:
                return parse_size(text), fraction
            except ValueError as exc:
                raise ModelError("placement.default_share", str(exc)) from None
        try:
            pct = float(text.strip()[:-1])
        except ValueError:
            raise ModelError("placement.default_share", f"not a percentage: {text!r}") from None
        if not 0 < pct <= 100:
            raise ModelError("placement.default_share", f"must be between 0% and 100%, got {text!r}")
        return None, pct / 100


class Shares(_Section, frozen=True, kw_only=True):
    enforcement: ShareEnforcement = ShareEnforcement.REPORT
    mps: bool = False


class Workers(_Section, frozen=True, kw_only=True):
    device_naming: DeviceNaming = DeviceNaming.INDICES
    promotion_signal: str = "SIGUSR1"
    log_max_bytes: PositiveInt = 100 * 1024 * 1024
    log_backups: PositiveInt = 3
    tracking: WorkerTracking = WorkerTracking.AUTO
    cpu_bind: CpuBindDefault = CpuBindDefault.AUTO

    def signal_number(self) -> int:
        try:
            return int(signal.Signals[self.promotion_signal])
        except KeyError:
            raise ModelError("workers.promotion_signal", f"unknown signal {self.promotion_signal!r}") from None


class JobsConfig(_Section, frozen=True, kw_only=True):
    """The `[jobs]` table: how long an ended job stays listed (with its exit codes) before it is forgotten."""

    retention_s: Annotated[float, Meta(ge=0)] = 24 * 3600.0


class Limits(_Section, frozen=True, kw_only=True):
    """Per user, so one user cannot exhaust cgd for the others; root has none."""

    components_per_user: PositiveInt = 256
    pending_per_user: PositiveInt = 64
    connections_per_user: PositiveInt = 64


class EventsConfig(_Section, frozen=True, kw_only=True):
    """The `[events]` table: how many recent events cgd keeps for `GET /v1/events` (a ring)."""

    keep: Annotated[int, Meta(ge=100, le=1_000_000)] = 10_000


def split_listen(address: str) -> tuple[str, int]:
    """("127.0.0.1", 9404) from "127.0.0.1:9404"; IPv6 hosts in brackets ("[::1]:9404").

    >>> split_listen("[::1]:9404")
    ('::1', 9404)
    """
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


class ConfigFile(_Section, frozen=True, kw_only=True):
    """The whole file; every section and key is optional."""


    placement: Placement = msgspec.field(default_factory=Placement)
    pools: dict[str, Pool] = {}
    health: HealthConfig = msgspec.field(default_factory=HealthConfig)
    shares: Shares = msgspec.field(default_factory=Shares)
    workers: Workers = msgspec.field(default_factory=Workers)
    limits: Limits = msgspec.field(default_factory=Limits)
    jobs: JobsConfig = msgspec.field(default_factory=JobsConfig)
    sharing: SharingTable = msgspec.field(default_factory=SharingTable)
    events: EventsConfig = msgspec.field(default_factory=EventsConfig)
    metrics_listen: str | None = None
    """A TCP address to serve `/metrics` on for Prometheus as well (off by default: the
    Unix socket's `/metrics` needs no port)."""

    def daemon_config(self) -> DaemonConfig:
        """What cgd reads; raises ModelError for a value that only reads as text."""
        share_mib, share_fraction = self.placement.share()
        try:
            sharing = self.sharing.rules()
        except ValueError as exc:
            path, _, problem = str(exc).partition(": ")
            raise ModelError(path, problem) from None
        return DaemonConfig(
            allocator=AllocatorConfig(
                pools={name: frozenset(gpus) for name, gpus in self.pools.items()},
                default_share_mib=share_mib, default_share_fraction=share_fraction,
                default_strategy=self.placement.default_strategy, sharing=sharing,
            ),
            health=self.health,
            share_enforcement=self.shares.enforcement,
            mps=self.shares.mps,
            device_naming=self.workers.device_naming,
            promotion_signal=self.workers.signal_number(),
            log_max_bytes=self.workers.log_max_bytes,
            log_backups=self.workers.log_backups,
            worker_tracking=self.workers.tracking,
            cpu_bind=self.workers.cpu_bind,
            limits=self.limits,
            jobs=self.jobs,
            events=self.events,
            metrics_listen=self._metrics_listen(),
        )

    def _metrics_listen(self) -> str | None:
        address = self.metrics_listen
        if address is None:
            return None
        host, port = address.rpartition(":")[0], address.rpartition(":")[2]
        if not host or not port.isdigit() or not 0 <= int(port) < 65536 or (":" in host and not host.startswith("[")):
            raise ModelError("metrics_listen", f'expected "HOST:PORT" like "127.0.0.1:9404" (an IPv6 host in '
                                               f'brackets, port 0 for any free one), got {address!r}')
        return address


class DaemonConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The settings as cgd's parts use them, whatever section of the file they came from."""

    allocator: AllocatorConfig = msgspec.field(default_factory=AllocatorConfig)
    health: HealthConfig = msgspec.field(default_factory=HealthConfig)
    share_enforcement: ShareEnforcement = ShareEnforcement.REPORT
    mps: bool = False
    device_naming: DeviceNaming = DeviceNaming.INDICES
    promotion_signal: int = int(signal.SIGUSR1)
    log_max_bytes: int = 100 * 1024 * 1024
    log_backups: int = 3
    worker_tracking: WorkerTracking = WorkerTracking.AUTO
    cpu_bind: CpuBindDefault = CpuBindDefault.AUTO
    limits: Limits = msgspec.field(default_factory=Limits)
    jobs: JobsConfig = msgspec.field(default_factory=JobsConfig)
    events: EventsConfig = msgspec.field(default_factory=EventsConfig)
    metrics_listen: str | None = None
    source: str = "config"
    """The file the settings were read from: a problem found later (a GPU the machine lacks) names it."""


def load_config(path: str | Path | None) -> DaemonConfig:
    if path is None:
        return DaemonConfig()
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such configuration file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_config(data, str(path))


def parse_config(data: dict[str, Any], name: str = "config") -> DaemonConfig:
    try:
        return msgspec.structs.replace(convert(data, ConfigFile).daemon_config(), source=name)
    except ModelError as exc:
        raise ConfigError(f"{name}: {exc}") from None
