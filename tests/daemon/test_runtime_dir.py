"""cgd's runtime directory: no one else may change where a root cgd writes.

A security review found a root cgd writing role files through a symlink
another user planted in the runtime directory, and an existing runtime
directory (even a 0777 one) accepted as it was. Also here: worker logs are
rotated within about a second of passing `log_max_bytes`.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from computegroups.daemon.core.workers import WorkerPaths, write_role
from computegroups.daemon.paths import UnsafeDirectory, cgd_runtime_dir
from tests.daemon_fixture import Cgd

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")


def make_dir(path: Path, mode: int) -> Path:
    path.mkdir()
    os.chmod(path, mode)
    return path


def victim(tmp_path: Path) -> Path:
    """A file only cgd's user may write, the target of every planted symlink."""
    target = tmp_path / "victim"
    target.write_text("precious\n")
    return target


# -- write_role -------------------------------------------------------------


def test_write_role_ignores_a_symlink_at_the_old_temporary_name(tmp_path: Path) -> None:
    target = victim(tmp_path)
    paths = WorkerPaths(tmp_path / "logs", make_dir(tmp_path / "run", 0o755), "test")
    roles = make_dir(tmp_path / "run" / "roles", 0o755)
    (roles / "job.tmp").symlink_to(target)
    write_role(paths, "job", 0, "primary", os.getuid(), os.getgid())
    assert target.read_text() == "precious\n"
    assert (roles / "job.0").read_text() == "primary\n"


def test_write_role_replaces_a_symlink_at_the_role_file_without_following_it(tmp_path: Path) -> None:
    target = victim(tmp_path)
    paths = WorkerPaths(tmp_path / "logs", make_dir(tmp_path / "run", 0o755), "test")
    roles = make_dir(tmp_path / "run" / "roles", 0o755)
    (roles / "job.0").symlink_to(target)
    write_role(paths, "job", 0, "shadow", os.getuid(), os.getgid())
    assert target.read_text() == "precious\n"
    role_file = roles / "job.0"
    assert not role_file.is_symlink() and role_file.read_text() == "shadow\n"
    assert stat.S_IMODE(role_file.stat().st_mode) == 0o644
    assert [p.name for p in roles.iterdir()] == ["job.0"]


def test_write_role_refuses_a_roles_dir_that_is_a_symlink(tmp_path: Path) -> None:
    elsewhere = make_dir(tmp_path / "elsewhere", 0o700)
    paths = WorkerPaths(tmp_path / "logs", make_dir(tmp_path / "run", 0o755), "test")
    (tmp_path / "run" / "roles").symlink_to(elsewhere)
    with pytest.raises(UnsafeDirectory, match="is a symbolic link"):
        write_role(paths, "job", 0, "primary", os.getuid(), os.getgid())
    assert list(elsewhere.iterdir()) == []
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o700


def test_write_role_refuses_a_roles_dir_others_can_write(tmp_path: Path) -> None:
    paths = WorkerPaths(tmp_path / "logs", make_dir(tmp_path / "run", 0o755), "test")
    roles = make_dir(tmp_path / "run" / "roles", 0o777)
    with pytest.raises(UnsafeDirectory, match=r"writable by others \(mode 0777\)"):
        write_role(paths, "job", 0, "primary", os.getuid(), os.getgid())
    assert list(roles.iterdir()) == []


@as_root
def test_write_role_gives_the_file_to_the_worker_not_the_directory(tmp_path: Path) -> None:
    paths = WorkerPaths(tmp_path / "logs", make_dir(tmp_path / "run", 0o755), "test")
    write_role(paths, "job", 1, "primary", NOBODY, NOBODY)
    role_file = tmp_path / "run" / "roles" / "job.1"
    assert (role_file.stat().st_uid, role_file.stat().st_gid) == (NOBODY, NOBODY)
    assert role_file.parent.stat().st_uid == 0
    assert stat.S_IMODE(role_file.parent.stat().st_mode) == 0o755


# -- the runtime directory --------------------------------------------------


def test_a_missing_runtime_dir_is_created_0755(tmp_path: Path) -> None:
    run = tmp_path / "deep" / "run"
    old = os.umask(0o077)
    try:
        assert cgd_runtime_dir(run, "cgd.sock") == run
    finally:
        os.umask(old)
    assert stat.S_IMODE(run.stat().st_mode) == 0o755


def test_a_private_existing_runtime_dir_is_used_as_it_is(tmp_path: Path) -> None:
    run = make_dir(tmp_path / "run", 0o700)
    assert cgd_runtime_dir(run, "cgd.sock") == run
    assert stat.S_IMODE(run.stat().st_mode) == 0o700


def test_a_world_writable_runtime_dir_is_refused(tmp_path: Path) -> None:
    run = make_dir(tmp_path / "run", 0o777)
    with pytest.raises(UnsafeDirectory, match=rf"{run} is writable by others \(mode 0777\)"):
        cgd_runtime_dir(run, "cgd.sock")


def test_a_group_writable_runtime_dir_is_refused(tmp_path: Path) -> None:
    run = make_dir(tmp_path / "run", 0o775)
    with pytest.raises(UnsafeDirectory, match=r"writable by its group \(mode 0775\)"):
        cgd_runtime_dir(run, "cgd.sock")


def test_a_runtime_dir_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    real = make_dir(tmp_path / "real", 0o755)
    (tmp_path / "run").symlink_to(real)
    with pytest.raises(UnsafeDirectory, match="is a symbolic link"):
        cgd_runtime_dir(tmp_path / "run", "cgd.sock")


def test_a_runtime_dir_inside_a_dir_others_can_write_is_refused(tmp_path: Path) -> None:
    open_dir = make_dir(tmp_path / "open", 0o777)
    run = make_dir(open_dir / "run", 0o755)
    with pytest.raises(UnsafeDirectory, match=rf"inside {open_dir}, which others can change"):
        cgd_runtime_dir(run, "cgd.sock")


@as_root
def test_a_runtime_dir_of_another_user_is_refused(tmp_path: Path) -> None:
    """Like /tmp/computegroups-UID created in advance by someone else."""
    run = make_dir(tmp_path / "run", 0o755)
    os.chown(run, NOBODY, NOBODY)
    with pytest.raises(UnsafeDirectory, match=rf"belongs to uid {NOBODY}, not to cgd's uid 0"):
        cgd_runtime_dir(run, "cgd.sock")


def test_a_sticky_shared_dir_gets_a_private_subdir(tmp_path: Path) -> None:
    shared = make_dir(tmp_path / "tmp", 0o1777)
    own = cgd_runtime_dir(shared, "cgd.sock")
    assert own == shared / "cgd.sock.d"
    st = os.lstat(own)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
    assert stat.S_IMODE(st.st_mode) == 0o755
    assert cgd_runtime_dir(shared, "cgd.sock") == own


def test_a_planted_private_subdir_in_a_shared_dir_is_refused(tmp_path: Path) -> None:
    shared = make_dir(tmp_path / "tmp", 0o1777)
    make_dir(shared / "cgd.sock.d", 0o777)
    with pytest.raises(UnsafeDirectory, match=r"cgd.sock.d is writable by others"):
        cgd_runtime_dir(shared, "cgd.sock")


# -- a real cgd ---------------------------------------------------------------


@pytest.mark.slow
def test_cgd_refuses_a_world_writable_runtime_dir(
    start_cgd: Callable[..., Cgd], tmp_path: Path,
) -> None:
    make_dir(tmp_path / "run", 0o777)
    with pytest.raises(RuntimeError) as refused:
        start_cgd("dgx-h100", root=tmp_path)
    assert f"cgd: error: runtime directory {tmp_path / 'run'} is writable by others (mode 0777)" in str(
        refused.value
    )
    assert not (tmp_path / "run" / "roles").exists()


@pytest.mark.slow
def test_cgd_in_a_sticky_dir_keeps_its_files_in_a_private_subdir(
    start_cgd: Callable[..., Cgd], tmp_path: Path,
) -> None:
    shared = make_dir(tmp_path / "run", 0o1777)
    cgd = start_cgd("dgx-h100", root=tmp_path)
    status, reply = cgd.request("POST", "/v1/components", {
        "name": "job", "claim": {"gpus": 1}, "command": [sys.executable, "-c", "import time; time.sleep(600)"],
    })
    assert status == 201, (reply, cgd.log())
    role_file = shared / "cgd.sock.d" / "roles" / "job.0"
    wait_until(role_file.exists, 10.0)
    assert role_file.read_text() == "primary\n"
    assert sorted(p.name for p in shared.iterdir()) == ["cgd.sock", "cgd.sock.d"]
    assert stat.S_IMODE((shared / "cgd.sock.d" / "circus").stat().st_mode) == 0o700


CHATTY = "import time\nwhile True:\n    print('x' * 99, flush=True)\n    time.sleep(0.005)\n"
"""About 20 KB a second: past a 10 KB limit in half a second."""


@pytest.mark.slow
def test_a_chatty_workers_log_is_rotated_within_about_a_second(
    start_cgd: Callable[..., Cgd], tmp_path: Path,
) -> None:
    config = tmp_path / "cgd.toml"
    config.write_text("[workers]\nlog_max_bytes = 10000\nlog_backups = 2\n")
    cgd = start_cgd("dgx-h100", "--config", str(config))
    status, reply = cgd.request("POST", "/v1/components", {
        "name": "chatty", "claim": {"gpus": 1}, "command": [sys.executable, "-c", CHATTY],
    })
    assert status == 201, (reply, cgd.log())
    log_file = cgd.log_dir / "chatty" / "0.out"
    wait_until(lambda: log_file.exists() and log_file.stat().st_size > 10000, 10.0)
    wait_until(log_file.with_name("0.out.1").exists, 2.5)


def wait_until(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout}s"
        time.sleep(0.02)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root (CI runs as root)")
@pytest.mark.parametrize(("owner", "mode", "problem"), [
    ("nobody", 0o700, "belongs to uid"),
    ("root", 0o777, "is writable by"),
])
def test_a_state_directory_another_user_may_change_stops_cgd(
    start_cgd: Callable[..., Cgd], tmp_path: Path, owner: str, mode: int, problem: str,
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.chown(state, NOBODY if owner == "nobody" else 0, -1)
    state.chmod(mode)
    with pytest.raises(RuntimeError) as failed:
        start_cgd("dgx-h100", "--state-dir", str(state))
    assert "cgd exited with 3" in str(failed.value)
    assert problem in str(failed.value) and "no one else can change them" in str(failed.value)
    assert not (state / "cgd.pid").exists() and not (state / "state.json").exists()
