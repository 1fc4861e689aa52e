"""Several real processes: writers killed at random moments, racing writers, a lock held elsewhere, readers."""

from __future__ import annotations

import logging
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from computegroups.statefiles import StateLockedError, StateStore
from tests.statefiles.child import GROUP, content_for

CHILD = Path(__file__).with_name("child.py")
pytestmark = pytest.mark.slow


class Writer:
    """`child.py write`: a process committing generation after generation; collects the acknowledged ones."""

    def __init__(self, directory: Path, seed: int = 0) -> None:
        self.process = subprocess.Popen([sys.executable, str(CHILD), "write", str(directory), str(seed)],
                                        stdout=subprocess.PIPE, text=True)
        self.acked: list[int] = []
        self.first = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.acked.append(int(line))
            self.first.set()
        self.first.set()

    def kill(self) -> list[int]:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self._reader.join(10)
        assert self.process.stdout is not None
        self.process.stdout.close()
        return self.acked


def _check_state(directory: Path, low: int) -> int:
    """The state loads without the backup, holds what its generation wrote, and is not older than `low`
    (nor newer than one group of commits after it); the backup snapshot with the journals after it reaches
    the same state."""
    store = StateStore(directory)
    doc = store.load()
    assert low <= doc.generation <= low + GROUP, f"acknowledged {low}, found {doc.generation}"
    assert doc == content_for(doc.generation), f"generation {doc.generation} does not hold what it wrote"
    if store.backup_path.exists():
        backup = StateStore(directory)
        backup.path = store.backup_path
        assert backup.load() == doc
    return doc.generation


def test_a_writer_killed_at_random_moments_never_loses_an_acknowledged_write(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest) -> None:
    """About 40 kills in a CI run; with --long, 400 (a few seconds against about a minute)."""
    scale = 10 if request.config.getoption("--long") else 1
    rng = random.Random(20240611)
    kills, writes, deadline = 0, 0, time.monotonic() + 25 * scale
    outcomes = {"between commits": 0, "during a write": 0, "after a commit, before its acknowledgement": 0}
    durable = 0
    with caplog.at_level(logging.WARNING, logger="computegroups.statefiles"):
        while (kills < 40 * scale or writes < 400 * scale) and time.monotonic() < deadline:
            writer = Writer(tmp_path, seed=kills)
            assert writer.first.wait(20), "the writer never committed"
            time.sleep(rng.uniform(0, 0.03))
            acked = writer.kill()
            assert acked == list(range(durable + 1, durable + 1 + len(acked))), "acknowledgements out of order"
            low = acked[-1] if acked else durable
            found = _check_state(tmp_path, low)
            if (tmp_path / "state.json.tmp").exists():
                outcomes["during a write"] += 1
                (tmp_path / "state.json.tmp").unlink()
            else:
                outcomes["between commits" if found == low else "after a commit, before its acknowledgement"] += 1
            kills, writes, durable = kills + 1, writes + len(acked), found
    assert not caplog.records, "a killed writer must never leave a state file that needs the backup"
    assert kills >= 30 * scale and writes >= 200 * scale, f"only {kills} kills over {writes} writes before the deadline"
    print(f"\n{kills} kills over {writes} acknowledged writes: {outcomes}")


def test_processes_doing_read_modify_write_lose_no_update(tmp_path: Path) -> None:
    processes, increments = 4, 25
    children = [
        subprocess.Popen([sys.executable, str(CHILD), "increment", str(tmp_path), str(increments)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    for child in children:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.close()
    for child in children:
        assert child.wait(60) == 0
        assert child.stdout is not None
        child.stdout.close()
    doc = StateStore(tmp_path).load()
    assert doc.components["counter"].spec.env["COUNT"] == str(processes * increments)
    assert doc.generation == processes * increments


def test_a_lock_held_by_another_process_times_out_naming_its_pid(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, str(CHILD), "hold", str(tmp_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        store = StateStore(tmp_path, lock_timeout=0.3)
        started = time.monotonic()
        with pytest.raises(StateLockedError) as refused, store.transaction():
            pass
        assert 0.25 <= time.monotonic() - started < 5
        assert str(refused.value).startswith(f"state is locked by pid {holder.pid} (python")
        assert store.load().generation == 0, "readers do not wait for the lock"
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        assert holder.wait(10) == 0
        assert holder.stdout is not None
        holder.stdout.close()
    with store.transaction() as doc:
        assert doc.drained == ("GPU-held",)


def test_a_lock_is_released_when_its_holder_is_killed(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, str(CHILD), "hold", str(tmp_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    holder.kill()
    holder.wait()
    holder.stdout.close()
    assert holder.stdin is not None
    holder.stdin.close()
    with StateStore(tmp_path, lock_timeout=5).transaction() as doc:
        assert doc.generation == 0


def test_readers_never_see_half_a_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    writer = Writer(tmp_path)
    try:
        assert writer.first.wait(20)
        store = StateStore(tmp_path)
        seen: list[int] = []
        stop = time.monotonic() + 1.5
        with caplog.at_level(logging.WARNING, logger="computegroups.statefiles"):
            while time.monotonic() < stop:
                doc = store.load()
                assert doc == content_for(doc.generation)
                seen.append(doc.generation)
    finally:
        writer.kill()
    assert not caplog.records
    assert seen == sorted(seen) and len(set(seen)) > 20, f"saw only {len(set(seen))} generations"
