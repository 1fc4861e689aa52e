"""A full disk under the state: the request is refused with 507, nothing changes, and cgd recovers by itself."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from computegroups.statefiles import StateStore
from tests.daemon_fixture import Cgd


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs: a real filesystem that really fills up."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> Path:
    """Write until the filesystem says there is no space left; returns the filler."""
    filler = directory / "filler"
    with open(filler, "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError:
            pass
    return filler


def test_no_space_is_507_changes_nothing_and_cgd_recovers(start_cgd: Callable[..., Cgd], small_disk: Path) -> None:
    cgd = start_cgd("dgx-h100", "--state-dir", str(small_disk / "state"))
    assert cgd.request("POST", "/v1/components", {"name": "a", "claim": {"gpus": 1}})[0] == 201
    store = StateStore(small_disk / "state")
    before = store.load()
    assert set(before.components) == {"a"}
    filler = fill(small_disk)
    # Larger than what is left of the journal's last block, which a small change could still use.
    big = {"name": "b", "claim": {"gpus": 1}, "env": {"PAYLOAD": "x" * 65536}}

    status, reply = cgd.request("POST", "/v1/components", big)
    assert status == 507, reply
    assert reply["error"]["code"] == "insufficient_storage"
    assert "No space left on device" in reply["error"]["message"]
    assert store.load() == before
    assert [c["name"] for c in cgd.request("GET", "/v1/components")[1]["components"]] == ["a"]
    done = cgd.cgctl("allocate", "c", "--gpus", "1", "--env", "PAYLOAD=" + "x" * 65536)
    assert done.returncode == 1 and "No space left on device" in done.stderr, done

    filler.unlink()
    status, reply = cgd.request("POST", "/v1/components", {"name": "b", "claim": {"gpus": 1}})
    assert status == 201, reply
    assert set(store.load().components) == {"a", "b"}
