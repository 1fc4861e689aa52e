"""A wrong configuration stops cgd with the file, the key and the problem."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from computegroups.daemon.model.claims import Strategy
from computegroups.daemon.model.config import ConfigError, DaemonConfig, load_config, parse_config


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


def test_share_as_a_percentage() -> None:
    config = parse_config({"placement": {"default_share": "50%"}})
    assert config.allocator.default_share_fraction == 0.5


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"colour": {}}, "colour: unknown section"),
        ({"health": {"speed": 1}}, "health.speed: unknown key"),
        ({"placement": {"default_strategy": "random"}}, "placement.default_strategy"),
        ({"placement": {"default_share": "lots"}}, "placement.default_share"),
        ({"placement": {"default_share": "150%"}}, "between 0% and 100%"),
        ({"pools": {"p": []}}, "pools.p: a pool needs at least one GPU"),
        ({"pools": {"p": ["0"]}}, "pools.p: expected a list of GPU indices"),
        ({"health": {"interval_s": 0}}, "health.interval_s"),
        ({"shares": {"enforcement": "kill"}}, "shares.enforcement"),
        ({"workers": {"device_naming": "names"}}, "workers.device_naming"),
        ({"workers": {"promotion_signal": "SIGNOPE"}}, "unknown signal"),
    ],
)
def test_mistakes_are_named(data, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(data, "cgd.toml")


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such configuration file"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[placement\n")
    with pytest.raises(ConfigError, match="bad.toml: not valid TOML"):
        load_config(bad)
