"""Worker log files: paths, ownership, copy-truncate rotation under a live writer, reading back."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from computegroups.daemon.supervision import worklogs
from computegroups.daemon.supervision.worklogs import (
    log_paths,
    prepare_log_file,
    read_from,
    read_log,
    read_tail,
    rotate,
    rotate_all,
)


def test_paths_are_per_replica_and_names_are_checked(tmp_path: Path) -> None:
    out, err = log_paths(tmp_path, "web-1", 3)
    assert (out, err) == (tmp_path / "web-1" / "3.out", tmp_path / "web-1" / "3.err")
    for bad in ("../etc", "Web", "", "a/b", "-x", "a" * 64):
        with pytest.raises(ValueError):
            log_paths(tmp_path, bad, 0)
    with pytest.raises(ValueError):
        log_paths(tmp_path, "web", -1)


def test_prepare_creates_the_file_for_its_owner(tmp_path: Path) -> None:
    out, _ = log_paths(tmp_path / "logs", "web", 0)
    prepare_log_file(out, os.getuid(), os.getgid())
    st = os.stat(out)
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_size == 0
    assert stat.S_IMODE(os.stat(out.parent).st_mode) == 0o755
    out.write_text("kept\n")
    prepare_log_file(out, os.getuid(), os.getgid())
    assert out.read_text() == "kept\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="changing owners needs root")
def test_a_previous_owners_logs_are_not_handed_to_the_next(tmp_path: Path) -> None:
    out, _ = log_paths(tmp_path, "web", 0)
    out.parent.mkdir()
    out.write_text("secret of uid 0\n")
    Path(f"{out}.1").write_text("older secret\n")
    prepare_log_file(out, 65534, 65534)
    st = os.stat(out)
    assert (st.st_uid, st.st_gid, st.st_size) == (65534, 65534, 0)
    assert not Path(f"{out}.1").exists()


def test_symlinks_are_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("x" * 100)
    link = tmp_path / "web" / "0.out"
    link.parent.mkdir()
    link.symlink_to(target)
    assert not rotate(link, 10, 2)
    assert target.read_text() == "x" * 100
    with pytest.raises(OSError):
        read_tail(link, 5)
    prepare_log_file(link, os.getuid(), os.getgid())
    assert not link.is_symlink() and target.read_text() == "x" * 100


def test_rotation_keeps_backups_newest_first(tmp_path: Path) -> None:
    path = tmp_path / "web" / "0.out"
    path.parent.mkdir()
    for generation in "abcd":
        path.write_text(generation * 20)
        assert rotate(path, 10, 2)
        assert path.read_text() == ""
    assert Path(f"{path}.1").read_text() == "d" * 20
    assert Path(f"{path}.2").read_text() == "c" * 20
    assert not Path(f"{path}.3").exists()
    path.write_text("small")
    assert not rotate(path, 10, 2)
    assert not rotate(tmp_path / "missing.out", 10, 2)


def test_rotation_without_backups_just_truncates(tmp_path: Path) -> None:
    path = tmp_path / "0.err"
    path.write_text("y" * 50)
    assert rotate(path, 10, 0)
    assert path.read_text() == "" and list(tmp_path.iterdir()) == [path]


def test_rotation_under_a_live_appending_writer(tmp_path: Path) -> None:
    """The writer keeps its O_APPEND descriptor: after the truncation it
    writes at offset 0 again, no hole of NUL bytes, nothing reopened."""
    log_dir = tmp_path / "logs"
    out, _ = log_paths(log_dir, "web", 0)
    prepare_log_file(out, os.getuid(), os.getgid())
    code = ("import sys, time\n"
            "for i in range(400):\n"
            "    sys.stdout.write(f'line {i:05d} ' + 'x' * 50 + '\\n'); sys.stdout.flush(); time.sleep(0.001)\n")
    with open(out, "ab") as fh:
        writer = subprocess.Popen([sys.executable, "-c", code], stdout=fh)
    rotated = 0
    while writer.poll() is None:
        rotated += len(rotate_all(log_dir, 4096, 3))
        time.sleep(0.02)
    writer.wait()
    assert rotated >= 2
    current = out.read_bytes()
    assert b"\0" not in current and current.startswith(b"line ")
    newest = Path(f"{out}.1").read_bytes()
    assert b"\0" not in newest and newest.startswith(b"line ")
    assert current.endswith(b"line 00399 " + b"x" * 50 + b"\n")
    assert sorted(p.name for p in out.parent.iterdir()) == ["0.out", "0.out.1", "0.out.2", "0.out.3"]


def test_tail_and_follow(tmp_path: Path) -> None:
    path = tmp_path / "0.out"
    path.write_bytes("one\ntwo\nthrée\nfour\n".encode())
    size = path.stat().st_size
    assert read_tail(path, 2).data == "thrée\nfour\n"
    assert read_tail(path, 2).offset == size
    assert read_tail(path, 99).data == "one\ntwo\nthrée\nfour\n"
    assert read_tail(path, 0).data == ""
    assert read_tail(path, None).data == "one\ntwo\nthrée\nfour\n"
    with open(path, "ab") as fh:
        fh.write(b"five, no newline yet")
    chunk = read_from(path, size)
    assert chunk.data == "five, no newline yet" and chunk.offset == path.stat().st_size


def test_follow_never_splits_a_character_and_restarts_after_rotation(tmp_path: Path) -> None:
    path = tmp_path / "0.out"
    encoded = "ab€".encode()
    path.write_bytes(encoded[:-1])
    first = read_from(path, 0)
    assert first.data == "ab" and first.offset == 2
    path.write_bytes(encoded)
    assert read_from(path, first.offset).data == "€"
    path.write_bytes(b"new")
    again = read_from(path, 100)
    assert (again.data, again.offset, again.size) == ("new", 3, 3)
    assert read_tail(path, 1, max_bytes=2).data == "ew"
    with pytest.raises(ValueError):
        read_from(path, -1)


def test_tail_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "0.out"
    path.write_bytes(b"z" * (worklogs.MAX_READ + 1000) + b"\nlast\n")
    assert len(read_tail(path, None).data) == worklogs.MAX_READ
    assert read_tail(path, 1).data == "last\n"


def test_read_log_answers_the_api(tmp_path: Path) -> None:
    path = tmp_path / "0.out"
    assert read_log(path) == {"path": str(path), "offset": 0, "size": 0, "data": ""}
    path.write_text("a\nb\n")
    assert read_log(path, tail=1) == {"path": str(path), "offset": 4, "size": 4, "data": "b\n"}
    assert read_log(path, offset=2)["data"] == "b\n"
    assert read_log(path)["data"] == "a\nb\n"
