"""Choosing how workers are tracked: a cgroup where cgd can create one, marks otherwise, and why."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from computegroups.daemon.model.config import ConfigError, WorkerTracking, parse_config
from computegroups.daemon.supervision import cgroups
from computegroups.daemon.supervision.cgroups import TrackingUnavailable, choose_tracking


def test_the_configuration_names_the_mode() -> None:
    assert parse_config({}).worker_tracking == WorkerTracking.AUTO
    assert parse_config({"workers": {"tracking": "marks"}}).worker_tracking == WorkerTracking.MARKS
    with pytest.raises(ConfigError, match="tracking"):
        parse_config({"workers": {"tracking": "cgroups"}})


def test_marks_when_asked_for_without_touching_cgroups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroups, "cgroup2_mount", lambda: pytest.fail("no probe when marks are asked for"))
    chosen = choose_tracking(WorkerTracking.MARKS, "/var/lib/computegroups")
    assert chosen.as_dict() == {"mode": "marks", "path": None,
                                "why": 'workers.tracking is "marks" in the configuration', "memory": False}
    assert chosen.worker_dir("web.0") is None


def test_without_a_cgroup2_mount_auto_falls_back_to_marks_and_cgroup_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroups, "cgroup2_mount", lambda: None)
    chosen = choose_tracking(WorkerTracking.AUTO, "/var/lib/computegroups")
    assert chosen.mode == "marks" and "no cgroup2 file system is mounted" in chosen.why
    with pytest.raises(TrackingUnavailable, match="no cgroup2 file system is mounted"):
        choose_tracking(WorkerTracking.CGROUP, "/var/lib/computegroups")


def test_a_hierarchy_without_cgroup_kill_is_not_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A plain directory stands for a kernel older than 5.14: the probe leaves nothing behind."""
    monkeypatch.setattr(cgroups, "cgroup2_mount", lambda: tmp_path)
    monkeypatch.setattr(cgroups, "own_cgroup", lambda: "/")
    chosen = choose_tracking(WorkerTracking.AUTO, "/var/lib/computegroups")
    assert chosen.mode == "marks" and "cgroup.kill" in chosen.why
    assert list(tmp_path.iterdir()) == []


def test_the_workers_directory_is_beside_cgd_and_named_by_the_state(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path) -> None:
    def fake_mkdir(self: Path, mode: int = 0o777) -> None:  # a cgroup comes with its files
        os.mkdir(self, mode)
        for name in ("cgroup.kill", "cgroup.procs", "cgroup.controllers"):
            (self / name).touch()

    (tmp_path / "system.slice" / "cgd.service").mkdir(parents=True)
    monkeypatch.setattr(cgroups, "cgroup2_mount", lambda: tmp_path)
    monkeypatch.setattr(cgroups, "own_cgroup", lambda: "/system.slice/cgd.service")
    monkeypatch.setattr(Path, "mkdir", fake_mkdir)
    one = choose_tracking(WorkerTracking.AUTO, "/var/lib/computegroups")
    again = choose_tracking(WorkerTracking.CGROUP, "/var/lib/computegroups")
    other = choose_tracking(WorkerTracking.AUTO, "/tmp/another-state")
    assert one.mode == "cgroup" and one.path == again.path != other.path
    assert one.path is not None and one.path.parent == tmp_path / "system.slice" / "cgd.service"
    assert one.worker_dir("web.0") == one.path / "web.0"


def test_reading_a_cgroup_that_is_gone_or_has_no_memory_controller(tmp_path: Path) -> None:
    assert cgroups.procs(tmp_path / "gone") == set() and cgroups.remove(tmp_path / "gone")
    assert cgroups.memory(tmp_path) is None
    (tmp_path / "memory.current").write_text("4096\n")
    assert cgroups.memory(tmp_path) == 4096


def test_started_in_the_units_leaf_the_workers_go_beside_it_and_memory_is_enabled_for_them(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`DelegateSubgroup=cgd`: cgd runs in `<service>/cgd`; the service's cgroup holds no process
    of its own, so it may enable the memory controller for its children, the workers' directory."""
    def fake_mkdir(self: Path, mode: int = 0o777) -> None:  # a cgroup under the service gets memory
        os.mkdir(self, mode)
        for name in ("cgroup.kill", "cgroup.procs"):
            (self / name).touch()
        (self / "cgroup.controllers").write_text("memory pids\n")

    service = tmp_path / "system.slice" / "computegroups.service"
    (service / "cgd").mkdir(parents=True)
    (service / "cgroup.controllers").write_text("cpu memory pids\n")
    monkeypatch.setattr(cgroups, "cgroup2_mount", lambda: tmp_path)
    monkeypatch.setattr(cgroups, "own_cgroup", lambda: "/system.slice/computegroups.service/cgd")
    monkeypatch.setattr(Path, "mkdir", fake_mkdir)
    chosen = choose_tracking(WorkerTracking.AUTO, "/var/lib/computegroups")
    assert chosen.path is not None and chosen.path.parent == service
    assert (service / "cgroup.subtree_control").read_text() == "+memory"
    assert (chosen.path / "cgroup.subtree_control").read_text() == "+memory"


def test_started_elsewhere_the_workers_go_inside_cgds_cgroup(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    def fake_mkdir(self: Path, mode: int = 0o777) -> None:
        os.mkdir(self, mode)
        for name in ("cgroup.kill", "cgroup.procs", "cgroup.controllers"):
            (self / name).touch()

    shell = tmp_path / "user.slice" / "session-3.scope"
    shell.mkdir(parents=True)
    (shell / "cgroup.controllers").write_text("memory\n")
    monkeypatch.setattr(cgroups, "cgroup2_mount", lambda: tmp_path)
    monkeypatch.setattr(cgroups, "own_cgroup", lambda: "/user.slice/session-3.scope")
    monkeypatch.setattr(Path, "mkdir", fake_mkdir)
    chosen = choose_tracking(WorkerTracking.AUTO, "/var/lib/computegroups")
    assert chosen.path is not None and chosen.path.parent == shell
    assert not (shell / "cgroup.subtree_control").exists(), "a cgroup with processes in it is left as it is"
    assert not chosen.memory and "without their memory" in chosen.describe()
