"""A wrong configuration stops cgd with the file, the key and the problem."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from computegroups.daemon.model.claims import Strategy
from computegroups.daemon.model.config import (
    ConfigError,
    DaemonConfig,
    DeviceNaming,
    ShareEnforcement,
    load_config,
    parse_config,
)


def test_no_file_gives_the_defaults() -> None:
    assert load_config(None) == DaemonConfig()


def test_a_full_file(tmp_path: Path) -> None:
    path = tmp_path / "cgd.toml"
    path.write_text(
        '[placement]\ndefault_strategy = "spread"\ndefault_share = "10GiB"\n'
        "[pools]\ntraining = [0, 1, 2, 3]\n"
        "[health]\ninterval_s = 0.5\nmax_temperature_c = 85\ncritical_xids = [79]\n"
        '[shares]\nenforcement = "stop"\nmps = true\n'
        '[workers]\ndevice_naming = "uuid"\npromotion_signal = "SIGUSR2"\n'
    )
    config = load_config(path)
    assert config.allocator.default_strategy is Strategy.SPREAD
    assert config.allocator.default_share_mib == 10240
    assert config.allocator.pools == {"training": frozenset({0, 1, 2, 3})}
    assert config.health.interval_s == 0.5 and config.health.critical_xids == (79,)
    assert config.share_enforcement == "stop" and config.mps
    assert config.device_naming == "uuid" and config.promotion_signal == signal.SIGUSR2


def test_the_choices_are_enums_that_compare_as_their_words() -> None:
    config = parse_config({"shares": {"enforcement": "stop"}, "workers": {"device_naming": "uuid"}})
    assert config.share_enforcement == "stop" and config.device_naming == "uuid"
    assert config.share_enforcement is ShareEnforcement.STOP and config.device_naming is DeviceNaming.UUID
    assert parse_config({}) == DaemonConfig()


def test_share_as_a_percentage() -> None:
    config = parse_config({"placement": {"default_share": "50%"}})
    assert config.allocator.default_share_fraction == 0.5


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"colour": {}},
         "colour: unknown field (known: placement, pools, health, shares, workers, limits, jobs, sharing, "
         "events, metrics_listen)"),
        ({"health": {"speed": 1}}, "health.speed: unknown field (known: interval_s, max_temperature_c,"),
        ({"placement": {"default_strategy": "random"}},
         "placement.default_strategy: must be one of binpack, spread, got 'random'"),
        ({"placement": {"default_share": "lots"}}, "placement.default_share: not a size: 'lots'"),
        ({"placement": {"default_share": "x%"}}, "placement.default_share: not a percentage: 'x%'"),
        ({"placement": {"default_share": "150%"}}, "placement.default_share: must be between 0% and 100%"),
        ({"placement": {"default_share": 25}}, "placement.default_share: expected a string, got 25"),
        ({"pools": {"p": []}}, "pools.p: may not be empty"),
        ({"pools": {"p": ["0"]}}, "pools.p[0]: expected an integer, got '0'"),
        ({"pools": {"ok": [0], "p": 3}}, "pools.p: expected a list, got 3"),
        ({"health": {"interval_s": 0}}, "health.interval_s: expected a positive number of seconds, got 0"),
        ({"health": {"critical_xids": [79, "x"]}}, "health.critical_xids[1]: expected an integer, got 'x'"),
        ({"health": {"max_temperature_c": 0}}, "health.max_temperature_c: must be at least 1, got 0"),
        ({"shares": {"enforcement": "kill"}}, "shares.enforcement: must be one of report, stop, got 'kill'"),
        ({"shares": {"mps": "yes"}}, "shares.mps: expected true or false, got 'yes'"),
        ({"workers": {"device_naming": "names"}}, "workers.device_naming: must be one of indices, uuid"),
        ({"workers": {"promotion_signal": "SIGNOPE"}}, "workers.promotion_signal: unknown signal 'SIGNOPE'"),
        ({"workers": {"log_backups": 0}}, "workers.log_backups: must be at least 1, got 0"),
    ],
)
def test_mistakes_are_named(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(data, "cgd.toml")
    assert str(err.value).startswith(f"cgd.toml: {message}")


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such configuration file"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[placement\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: not valid TOML"):
        load_config(bad)


def test_metrics_listen_and_events() -> None:
    config = parse_config({"metrics_listen": "127.0.0.1:9404", "events": {"keep": 500}})
    assert config.metrics_listen == "127.0.0.1:9404" and config.events.keep == 500
    assert parse_config({}).metrics_listen is None and parse_config({}).events.keep == 10_000
    assert parse_config({"metrics_listen": "[::1]:0"}).metrics_listen == "[::1]:0"
    for bad, message in (({"metrics_listen": "9404"}, 'metrics_listen: expected "HOST:PORT"'),
                         ({"metrics_listen": "host:70000"}, "got 'host:70000'"),
                         ({"metrics_listen": "::1:9404"}, "an IPv6 host in brackets"),
                         ({"events": {"keep": 1}}, "events.keep: must be between 100")):
        with pytest.raises(ConfigError, match=message):
            parse_config(bad)

