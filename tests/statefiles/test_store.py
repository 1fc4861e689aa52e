"""Transactions in one process: what is written, when, how, and what is refused."""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace

from computegroups.daemon.model.claims import Claim
from computegroups.daemon.model.enums import ComponentState, GroupState
from computegroups.daemon.model.requests import ComponentSpec
from computegroups.statefiles import (
    SCHEMA_VERSION,
    ComponentRecord,
    StateDoc,
    StateError,
    StateFormatError,
    StateLockedError,
    StateStore,
)
from tests.statefiles.samples import broken, commit, edit, populated_doc


def test_a_new_directory_is_an_empty_state_and_is_not_created_by_reading(store: StateStore) -> None:
    assert store.load() == StateDoc()
    assert not store.directory.exists()


def test_a_commit_bumps_the_generation_and_loads_back(store: StateStore) -> None:
    committed = commit(store, populated_doc())
    assert committed.generation == 1
    loaded = store.load()
    assert loaded == committed
    assert StateStore(store.directory).load() == committed


def test_changes_in_place_are_committed(store: StateStore) -> None:
    commit(store, populated_doc())
    with (txn := store.transaction()) as doc:
        edit(doc.groups, "web-0", state=GroupState.DRAINING)
        web = doc.components["web"]
        edit(doc.components, "web", spec=replace(web.spec, env={**web.spec.env, "B": "2"}))
        doc.drained = ()
    assert txn.written and txn.generation == 2 and doc.generation == 2
    assert txn.committed is doc
    loaded = store.load()
    assert loaded.groups["web-0"].state == "draining"
    assert loaded.components["web"].spec.env == {"A": "1", "B": "2"}
    assert loaded.drained == ()


def test_an_unchanged_document_is_not_written(store: StateStore) -> None:
    commit(store, populated_doc())
    before = store.path.stat()
    with (txn := store.transaction()) as doc:
        assert doc.groups["web-0"].state == "allocated"
    assert not txn.written and txn.generation == 1
    after = store.path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_an_unchanged_new_state_writes_nothing(store: StateStore) -> None:
    with store.transaction():
        pass
    assert not store.path.exists()


def test_an_exception_in_the_block_writes_nothing(store: StateStore) -> None:
    commit(store, populated_doc())
    before = store.path.read_bytes()
    with pytest.raises(RuntimeError), store.transaction() as doc:
        doc.groups.clear()
        raise RuntimeError("decided against it")
    assert store.path.read_bytes() == before
    with store.transaction() as doc:
        assert len(doc.groups) == 3


def test_an_invalid_document_is_refused_at_commit_and_nothing_is_written(store: StateStore) -> None:
    commit(store, populated_doc())
    before = store.path.read_bytes()
    refused = pytest.raises(StateFormatError, match=r'^groups\["web-0"\]\.devices\[0\]\.memory_mib: expected int')
    with refused, store.transaction() as doc:
        group = doc.groups["web-0"]
        edit(doc.groups, "web-0", devices=(replace(group.devices[0], memory_mib=1.5), *group.devices[1:]))
    assert store.path.read_bytes() == before
    with store.transaction() as doc:
        assert doc.groups["web-0"].devices[0].memory_mib == 81559


def _deeply_nested() -> Any:
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    return deep


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda doc: edit(doc.deployments, "site", spec={**doc.deployments["site"].spec, "weight": float("inf")}),
         'deployments["site"].spec["weight"]: expected a finite number, got inf'),
        (lambda doc: edit(doc.deployments, "site", spec={**doc.deployments["site"].spec, "env": {"A": {1, 2}}}),
         'deployments["site"].spec["env"]["A"]: expected a JSON value, got set'),
        (lambda doc: edit(doc.deployments, "site", spec={**doc.deployments["site"].spec, "ttl": [0.5, float("nan")]}),
         'deployments["site"].spec["ttl"][1]: expected a finite number, got nan'),
        (lambda doc: edit(doc.deployments, "site", spec={**doc.deployments["site"].spec, 1: "one"}),
         'deployments["site"].spec: object keys must be strings, got int 1'),
        (lambda doc: edit(doc.deployments, "site", spec={**doc.deployments["site"].spec, "deep": _deeply_nested()}),
         'deployments["site"].spec: nested too deeply'),
        (lambda doc: edit(doc.components, "web", spec=replace(doc.components["web"].spec, env={"B": 7})),
         'components["web"].spec.env["B"]: expected string, got int'),
        (lambda doc: broken(doc.groups, "web-0", claim=Claim(gpus=0)),
         'groups["web-0"].claim.gpus: must be'),
        (lambda doc: edit(doc.groups, "web-0", explanation=object()),
         'groups["web-0"]: not a JSON value'),
        (lambda doc: edit(doc.groups, "web-0", state="released"),
         'groups["web-0"].state: must be one of reserved, allocated, draining, degraded, lost, got \'released\''),
        (lambda doc: broken(doc.workers, "web/0", create_time=None),
         'workers["web/0"].create_time: required with a pid'),
        (lambda doc: doc.groups.update({"web-9": doc.groups["web-0"]}),
         'groups["web-9"]: id must match the key \'web-9\', got \'web-0\''),
    ],
)
def test_what_json_cannot_hold_and_broken_rules_are_refused_at_commit(
    store: StateStore, change: Any, message: str
) -> None:
    """msgspec's encoder would write inf as null and a set as a list: the store refuses them instead."""
    commit(store, populated_doc())
    before = store.path.read_bytes()
    with pytest.raises(StateFormatError) as refused, store.transaction() as doc:
        change(doc)
    assert str(refused.value).startswith(message)
    assert store.path.read_bytes() == before


def test_a_committed_document_is_not_shared_with_the_next_transaction(store: StateStore) -> None:
    committed = commit(store, populated_doc())
    committed.components.pop("web")
    committed.groups["web-0"] = replace(committed.groups["web-0"], users=())
    with store.transaction() as doc:
        assert doc.components["web"].spec.env == {"A": "1"}
        assert doc.groups["web-0"].users == ("web/0", "standby/0")


def test_the_caller_cannot_set_the_generation_or_version(store: StateStore) -> None:
    with store.transaction() as doc:
        doc.generation = 99
        doc.schema_version = 7
        doc.drained = ("GPU-x",)
    loaded = store.load()
    assert (loaded.generation, loaded.schema_version) == (1, SCHEMA_VERSION)


def test_the_document_can_be_replaced_whole(store: StateStore) -> None:
    commit(store, populated_doc())
    with (txn := store.transaction()):
        txn.doc = StateDoc(drained=("GPU-1",))
    assert store.load() == StateDoc(generation=2, drained=("GPU-1",))
    with pytest.raises(StateError, match="not open"):
        txn.doc = StateDoc()


def test_replacing_with_something_else_is_a_type_error(store: StateStore) -> None:
    with (txn := store.transaction()), pytest.raises(TypeError):
        txn.doc = {}  # type: ignore[assignment]


def test_a_transaction_is_entered_once(store: StateStore) -> None:
    txn = store.transaction()
    with txn:
        pass
    with pytest.raises(StateError, match="only once"), txn:
        pass


def test_a_nested_transaction_in_one_thread_is_refused(store: StateStore) -> None:
    with store.transaction(), pytest.raises(StateError, match="already open in this thread"), store.transaction():
        pass
    with store.transaction():
        pass


def test_the_file_is_readable_json_sealed_by_a_checksum(store: StateStore) -> None:
    commit(store, populated_doc())
    text = store.path.read_text()
    lines = text.splitlines()
    assert lines[:3] == ["{", f'  "schema_version": {SCHEMA_VERSION},', '  "generation": 1,']
    assert lines[-2].startswith('  "checksum": "sha256:') and lines[-1] == "}"
    assert sum('"id": "web-' in line for line in lines) == 2, "one group per line"
    data = json.loads(text)
    assert data["groups"]["web-0"]["devices"][0]["gpu_uuid"] == "GPU-aaaa"
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700


def test_the_previous_generation_is_kept_as_the_backup(store: StateStore) -> None:
    commit(store, populated_doc())
    first = store.path.read_bytes()
    assert not store.backup_path.exists()
    with store.transaction() as doc:
        doc.drained = ()
    assert store.backup_path.read_bytes() == first
    assert StateStore(store.directory).load().generation == 2
    assert sorted(p.name for p in store.directory.iterdir()) == [
        "state.journal.bak", "state.json", "state.json.bak", "state.lock"]


def test_the_backup_is_copied_where_hard_links_are_refused(store: StateStore,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    commit(store, populated_doc())
    first = store.path.read_bytes()

    def no_links(*args: Any) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    with store.transaction() as doc:
        doc.drained = ()
    assert store.backup_path.read_bytes() == first
    assert store.path.stat().st_ino != store.backup_path.stat().st_ino


def _record_file_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real_fsync, real_replace, real_link = os.fsync, os.replace, os.link

    def fsync(fd: int) -> None:
        calls.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        calls.append(f"rename {Path(src).name} -> {Path(dst).name}")
        real_replace(src, dst)

    def link(src: Any, dst: Any) -> None:
        calls.append(f"link {Path(src).name} -> {Path(dst).name}")
        real_link(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "link", link)
    return calls


def test_a_snapshot_fsyncs_the_file_before_the_renames_and_the_directory_after(
        store: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    commit(store, populated_doc())
    calls = _record_file_calls(monkeypatch)
    with store.transaction() as doc:
        doc.drained = ()
    assert calls == [
        "fsync file",  # the journal line: the backup's chain (the journal moved aside) holds it durably
        "fsync file",  # the snapshot
        "link state.json -> state.json.bak.tmp",
        "rename state.json.bak.tmp -> state.json.bak",
        "rename state.json.tmp -> state.json",
        "rename state.journal -> state.journal.bak",
        "fsync dir",
    ]


def test_a_journaled_commit_is_one_append_and_one_fsync(
        journaled: StateStore, monkeypatch: pytest.MonkeyPatch) -> None:
    commit(journaled, populated_doc())
    calls = _record_file_calls(monkeypatch)
    for _ in range(3):
        with journaled.transaction() as doc:
            doc.drained = () if doc.drained else ("GPU-aaaa",)
    assert calls == ["fsync file"] * 3
    assert StateStore(journaled.directory).load().generation == 4


class _Crash(BaseException):
    """Stands for the process dying at one step of a commit."""


@pytest.mark.parametrize("step", range(8))
def test_a_commit_cut_short_at_any_step_leaves_the_old_or_the_new_generation(
        store: StateStore, monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    commit(store, populated_doc())
    with store.transaction() as doc:
        doc.drained = ("GPU-aaaa",)
    steps = 0

    def crash_at(real: Any) -> Any:
        def wrapped(*args: Any) -> Any:
            nonlocal steps
            steps += 1
            if steps > step:
                raise _Crash
            return real(*args)
        return wrapped

    for name in ("fsync", "replace", "link", "write"):
        monkeypatch.setattr(os, name, crash_at(getattr(os, name)))
    with pytest.raises(_Crash), store.transaction() as doc:
        doc.drained = ("GPU-bbbb",)
    monkeypatch.undo()
    loaded = StateStore(store.directory).load()
    assert (loaded.generation, loaded.drained) in [(2, ("GPU-aaaa",)), (3, ("GPU-bbbb",))]
    backup = StateStore(store.directory)
    backup.path = store.backup_path
    assert backup.load().generation in (1, 2, loaded.generation)
    with store.transaction() as doc:
        doc.drained = ()
    assert store.load().generation == loaded.generation + 1


def test_a_lock_held_by_another_thread_times_out_naming_this_process(store: StateStore) -> None:
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with store.transaction():
            inside.set()
            leave.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert inside.wait(5)
        this_process = f"^state is locked by pid {os.getpid()} "
        with pytest.raises(StateLockedError, match=this_process), store.transaction(timeout=0.1):
            pass
        other = StateStore(store.directory, lock_timeout=0.1)
        with pytest.raises(StateLockedError, match=this_process), other.transaction():
            pass
    finally:
        leave.set()
        holder.join()
    with store.transaction(timeout=0):
        pass


@pytest.mark.parametrize("shared", [True, False], ids=["one-store", "store-per-thread"])
def test_threads_lose_no_update(tmp_path: Path, shared: bool) -> None:
    threads, increments = 4, 40
    one = StateStore(tmp_path, lock_timeout=10)

    def work() -> None:
        store = one if shared else StateStore(tmp_path, lock_timeout=10)
        for _ in range(increments):
            with store.transaction() as doc:
                counter = doc.components.setdefault("counter", ComponentRecord(
                    name="counter", owner_uid=0, owner_gid=0, replicas=0, state=ComponentState.ALLOCATED,
                    spec=ComponentSpec(env={"N": "0"})))
                doc.components["counter"] = replace(
                    counter, spec=replace(counter.spec, env={"N": str(int(counter.spec.env["N"]) + 1)}))

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    final = one.load()
    assert final.components["counter"].spec.env["N"] == str(threads * increments)
    assert final.generation == threads * increments


def test_a_negative_lock_timeout_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="lock_timeout"):
        StateStore(tmp_path, lock_timeout=-1)


def test_the_next_transaction_sees_exactly_what_a_reload_sees(store: StateStore) -> None:
    doc = populated_doc()
    edit(doc.deployments, "site", spec={"z": 1, "a": [1, {"y": 2, "b": 3}]})
    commit(store, doc)
    reloaded = StateStore(store.directory).load()
    with store.transaction() as following:
        assert following == reloaded
        assert list(following.groups) == list(reloaded.groups) == sorted(reloaded.groups)
        assert list(following.deployments["site"].spec) == ["z", "a"]


def test_a_write_by_another_store_is_seen_by_the_next_transaction(store: StateStore) -> None:
    commit(store, populated_doc())
    with StateStore(store.directory).transaction() as doc:
        edit(doc.groups, "web-1", state=GroupState.ALLOCATED)
    with store.transaction() as doc:
        assert doc.generation == 2
        assert doc.groups["web-1"].state == "allocated"


def _no_space_for(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes to the file called `name` fail as on a full disk; every other write goes through."""
    real = os.write

    def write(fd: int, data: Any) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("/" + name):
            raise OSError(errno.ENOSPC, "No space left on device", name)
        return real(fd, data)

    monkeypatch.setattr(os, "write", write)


def test_a_failed_write_is_a_state_error_and_is_not_acknowledged(journaled: StateStore,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    store = journaled
    commit(store, populated_doc())
    _no_space_for("state.journal", monkeypatch)
    txn = store.transaction()
    with pytest.raises(StateError, match=r"could not commit generation 2 .*No space left on device.*stays at "
                                         r"generation 1"), txn as doc:
        doc.drained = ()
    assert txn.committed is None and not txn.written
    monkeypatch.undo()
    assert store.load().generation == 1, "the journal is cut back to the last acknowledged entry"
    with store.transaction() as doc:
        assert doc.drained == ("GPU-cccc",)
        doc.drained = ("GPU-aaaa",)
    assert StateStore(store.directory).load().drained == ("GPU-aaaa",)


@pytest.mark.parametrize("snapshot_every", [1, 1000], ids=["snapshot", "journal"])
def test_a_failed_fsync_of_a_commit_refuses_every_change_after_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, snapshot_every: int) -> None:
    """As after a failed `sync()`: the page cache may be clean and wrong, so no retry may pretend otherwise."""
    store = StateStore(tmp_path / "state", snapshot_every=snapshot_every)
    commit(store, populated_doc())

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(StateError, match=r"could not make the state .* durable: Input/output error"), \
            store.transaction() as doc:
        doc.drained = ()
    monkeypatch.undo()
    with pytest.raises(StateError, match="restart cgd"), store.transaction() as doc:
        doc.drained = ("GPU-x",)
    with pytest.raises(StateError, match="restart cgd"):
        store.sync()
    assert StateStore(store.directory).load().generation == 1


def test_a_failed_fsync_of_the_state_read_at_start_refuses_every_change_and_every_sync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first transaction makes what it read durable; if that fails, a `sync()` must not return as if
    done while nothing it could fsync covers the state (cgd's durable() waited on it forever)."""
    commit(StateStore(tmp_path / "state"), populated_doc())
    store = StateStore(tmp_path / "state")

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(StateError, match=r"Input/output error.*generation 1\) may not be all on disk"), \
            store.transaction():
        pass
    monkeypatch.undo()
    assert store.refusal is not None
    with pytest.raises(StateError, match="restart cgd"):
        store.sync(1)
    with pytest.raises(StateError, match="restart cgd"), store.transaction() as doc:
        doc.drained = ("GPU-x",)


def test_a_snapshot_that_finds_no_space_leaves_the_previous_generation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The journal line went in before the snapshot failed: it is cut back, so the refused change is
    not what the next load finds."""
    store = StateStore(tmp_path / "state", snapshot_every=2)
    commit(store, populated_doc())
    _no_space_for("state.json.tmp", monkeypatch)
    with pytest.raises(StateError, match=r"could not commit generation 2 .*No space left on device.*stays at "
                                         r"generation 1"), store.transaction() as doc:
        doc.drained = ("GPU-refused",)
    monkeypatch.undo()
    for reader in (store, StateStore(store.directory)):
        loaded = reader.load()
        assert (loaded.generation, loaded.drained) == (1, ("GPU-cccc",))
    assert not (store.directory / "state.json.tmp").exists(), "the half-written snapshot is not left to fill the disk"
    with store.transaction() as doc:
        doc.drained = ("GPU-aaaa",)
    again = StateStore(store.directory).load()
    assert (again.generation, again.drained) == (2, ("GPU-aaaa",))
    assert store.path.exists()


def test_a_state_directory_that_cannot_be_created_is_a_state_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StateError, match="cannot lock the state in"), StateStore(blocker / "state").transaction():
        pass


def test_a_held_store_keeps_other_writers_out_between_its_transactions(tmp_path: Path) -> None:
    owner = StateStore(tmp_path)
    owner.hold()
    with owner.transaction() as doc:
        doc.drained = ("GPU-a",)
    other = StateStore(tmp_path, lock_timeout=0.1)
    with pytest.raises(StateLockedError, match=f"^state is locked by pid {os.getpid()} "), other.transaction():
        pass
    assert other.load().drained == ("GPU-a",), "readers take no lock"
    with owner.transaction() as doc:
        doc.drained = ("GPU-b",)
    owner.let_go()
    with other.transaction() as doc:
        assert doc.drained == ("GPU-b",)
        doc.drained = ()


def test_a_sync_in_flight_when_another_fsync_fails_makes_nothing_durable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two fsyncs of one journal share its error: the one that reports it poisons the store, and the
    other, returning 0, must not then call the change durable (its reply would say it is on disk)."""
    store = StateStore(tmp_path / "state")
    with store.transaction(sync=False) as doc:
        doc.drained = ("GPU-a",)
    target = store._written_generation
    assert store.durable_generation < target
    entered, go = threading.Event(), threading.Event()
    real = os.fsync

    def fsync(fd: int) -> None:
        if threading.current_thread() is threading.main_thread():
            raise OSError(errno.EIO, "Input/output error")
        entered.set()
        go.wait(5)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    errors: list[BaseException] = []

    def sync() -> None:
        try:
            store.sync(target)
        except StateError as exc:
            errors.append(exc)

    syncing = threading.Thread(target=sync)
    syncing.start()
    assert entered.wait(5)
    with pytest.raises(StateError):
        store.close()
    go.set()
    syncing.join(5)
    assert store.refusal is not None and store.durable_generation < target
    assert len(errors) == 1 and "restart cgd" in str(errors[0])
