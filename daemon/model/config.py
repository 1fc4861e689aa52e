"""cgd's configuration file (TOML), validated once at start-up.

A mistake in the file must stop cgd with the file, the key and the problem
named: a daemon that starts with a silently ignored pool or threshold hands
out GPUs under rules its operator did not write.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from computegroups.daemon.model.claims import AllocatorConfig, Strategy, parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

DEFAULT_CRITICAL_XIDS = (48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120)


class ConfigError(ValueError):
    """The configuration file is wrong; the message names file and key."""


@dataclass(frozen=True)
class HealthConfig:
    interval_s: float = 2.0
    max_temperature_c: int = 90
    critical_xids: tuple[int, ...] = DEFAULT_CRITICAL_XIDS
    drain_on_ecc: bool = True


@dataclass(frozen=True)
class DaemonConfig:
    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    share_enforcement: str = "report"
    mps: bool = False
    device_naming: str = "indices"
    promotion_signal: int = int(signal.SIGUSR1)
    log_max_bytes: int = 64 * 1024 * 1024
    log_backups: int = 3


_SECTIONS: dict[str, set[str]] = {
    "placement": {"default_strategy", "default_share"},
    "pools": set(),
    "health": {"interval_s", "max_temperature_c", "critical_xids", "drain_on_ecc"},
    "shares": {"enforcement", "mps"},
    "workers": {"device_naming", "promotion_signal", "log_max_bytes", "log_backups"},
}


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
    def fail(key: str, problem: str) -> ConfigError:
        return ConfigError(f"{name}: {key}: {problem}")

    for section, value in data.items():
        if section not in _SECTIONS:
            raise fail(section, f"unknown section (known: {', '.join(sorted(_SECTIONS))})")
        if not isinstance(value, dict):
            raise fail(section, "expected a table")
        allowed = _SECTIONS[section]
        if section != "pools":
            for key in value:
                if key not in allowed:
                    raise fail(f"{section}.{key}", f"unknown key (known: {', '.join(sorted(allowed))})")

    placement = data.get("placement", {})
    strategy = placement.get("default_strategy", "binpack")
    if strategy not in ("binpack", "spread"):
        raise fail("placement.default_strategy", f"must be binpack or spread, got {strategy!r}")
    share_mib: int | None = None
    share_fraction = AllocatorConfig().default_share_fraction
    share = placement.get("default_share")
    if share is not None:
        if not isinstance(share, str):
            raise fail("placement.default_share", "expected a string such as '25%' or '10GiB'")
        if share.strip().endswith("%"):
            try:
                pct = float(share.strip()[:-1])
            except ValueError:
                raise fail("placement.default_share", f"not a percentage: {share!r}") from None
            if not 0 < pct <= 100:
                raise fail("placement.default_share", "must be between 0% and 100%")
            share_fraction = pct / 100
        else:
            try:
                share_mib = parse_size(share)
            except ValueError as exc:
                raise fail("placement.default_share", str(exc)) from None

    pools: dict[str, frozenset[int]] = {}
    for pool, gpus in data.get("pools", {}).items():
        if not isinstance(gpus, list) or not all(isinstance(g, int) and not isinstance(g, bool) for g in gpus):
            raise fail(f"pools.{pool}", "expected a list of GPU indices")
        if not gpus:
            raise fail(f"pools.{pool}", "a pool needs at least one GPU")
        pools[pool] = frozenset(gpus)

    health = _health(data.get("health", {}), fail)
    shares = data.get("shares", {})
    enforcement = shares.get("enforcement", "report")
    if enforcement not in ("report", "stop"):
        raise fail("shares.enforcement", f"must be report or stop, got {enforcement!r}")
    mps = shares.get("mps", False)
    if not isinstance(mps, bool):
        raise fail("shares.mps", "expected true or false")

    workers = data.get("workers", {})
    naming = workers.get("device_naming", "indices")
    if naming not in ("indices", "uuid"):
        raise fail("workers.device_naming", f"must be indices or uuid, got {naming!r}")
    sig_name = workers.get("promotion_signal", "SIGUSR1")
    try:
        promotion_signal = int(signal.Signals[str(sig_name)])
    except KeyError:
        raise fail("workers.promotion_signal", f"unknown signal {sig_name!r}") from None
    log_max = _positive_int(workers, "log_max_bytes", 64 * 1024 * 1024, fail, "workers")
    backups = _positive_int(workers, "log_backups", 3, fail, "workers")

    return DaemonConfig(
        allocator=AllocatorConfig(
            pools=pools, default_share_mib=share_mib,
            default_share_fraction=share_fraction, default_strategy=Strategy(strategy),
        ),
        health=health,
        share_enforcement=enforcement,
        mps=mps,
        device_naming=naming,
        promotion_signal=promotion_signal,
        log_max_bytes=log_max,
        log_backups=backups,
    )


def _health(section: dict[str, Any], fail) -> HealthConfig:
    interval = section.get("interval_s", 2.0)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0:
        raise fail("health.interval_s", "expected a positive number of seconds")
    temp = _positive_int(section, "max_temperature_c", 90, fail, "health")
    xids = section.get("critical_xids", list(DEFAULT_CRITICAL_XIDS))
    if not isinstance(xids, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in xids):
        raise fail("health.critical_xids", "expected a list of Xid codes")
    drain_on_ecc = section.get("drain_on_ecc", True)
    if not isinstance(drain_on_ecc, bool):
        raise fail("health.drain_on_ecc", "expected true or false")
    return HealthConfig(float(interval), temp, tuple(xids), drain_on_ecc)


def _positive_int(section: dict[str, Any], key: str, default: int, fail, prefix: str) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise fail(f"{prefix}.{key}", "expected a positive integer")
    return value
