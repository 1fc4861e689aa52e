"""The state directory on disk: locked transactions, durable writes, a backup.

Every commit goes: lock, read, let the caller decide, validate, write a
temporary file in the same directory, fsync it, keep the previous file as the
backup (a hard link, so no bytes are copied), rename the new file over the old
one, fsync the directory. A rename is atomic, so a reader (which takes no
lock) sees the old generation or the new one, never half a file, and a writer
killed at any instant leaves a state that loads.

A commit may leave the two fsyncs to a later `sync()` (`transaction(sync=False)`),
so that changes committed while one fsync runs share the next (group commit).
Until then the change is visible but not durable: nothing may act on it. The
backup only ever becomes a file that is durable, so a power cut that tears
the newest state file falls back to a generation at least as new as the last
one `sync()` returned for.

Loading never makes up an empty state: only a directory with neither the
state file nor its backup is new. A bad state file falls back to the backup
with a warning naming both; two bad files are a refusal.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import NoReturn

import filelock
import msgspec
import psutil

from computegroups.daemon.model.enums import GroupState
from computegroups.statefiles.errors import (
    StateCorruptError,
    StateError,
    StateFormatError,
    StateLockedError,
    StateVersionError,
)
from computegroups.statefiles.fileformat import Decoded, decode, encode_body, seal
from computegroups.statefiles.fileformat import validated as decode_validated
from computegroups.statefiles.schema import StateDoc

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
BACKUP_FILE = "state.json.bak"
LOCK_FILE = "state.lock"
HOLDER_FILE = "state.lock.holder"
_POLL_S = 0.01
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS}


@dataclass
class _Loaded:
    """What a transaction started from, so the commit knows what to keep and whether anything changed."""

    doc: StateDoc
    source: Path | None
    raw: bytes
    rewrite: bool
    """Write even an unchanged document: it came from the backup, an older schema or a hand edit."""
    migrated_from: int | None = None
    generation: int = field(init=False)
    """As loaded: the caller may scribble on `doc.generation`, the store never trusts it."""

    def __post_init__(self) -> None:
        self.generation = self.doc.generation


class StateStore:
    """The one state directory of a daemon. Only the manager opens transactions; anyone may `load()`."""

    def __init__(self, directory: str | os.PathLike[str], lock_timeout: float = 10.0) -> None:
        if lock_timeout < 0:
            raise ValueError(f"lock_timeout must be >= 0 seconds, got {lock_timeout}")
        self.directory = Path(directory)
        self.lock_timeout = lock_timeout
        self.path = self.directory / STATE_FILE
        self.backup_path = self.directory / BACKUP_FILE
        self.lock_path = self.directory / LOCK_FILE
        self._holder_path = self.directory / HOLDER_FILE
        self._file_lock = filelock.FileLock(str(self.lock_path), mode=0o600)
        self._thread_lock = threading.Lock()
        self._in_transaction = threading.local()
        self.durable_generation = -1
        """The newest generation known to be on disk (fsync'd, file and directory); -1 until the first read."""
        self._written_generation = -1
        self._poisoned: str | None = None
        """Why the store refuses every change: an fsync failed, and what the disk holds is no longer known."""
        self._last_commit: tuple[bytes, StateDoc] | None = None
        """The bytes this store last wrote and a private copy of their document, guarded by the thread lock.

        The next transaction hands the copy over instead of parsing and
        validating the file again, if the file still holds exactly those bytes.
        """

    def __repr__(self) -> str:
        return f"StateStore({str(self.directory)!r})"

    def load(self) -> StateDoc:
        """The last committed state, without taking the lock (a rename is atomic)."""
        return self._read(self._read_bytes(self.path)).doc

    def transaction(self, timeout: float | None = None, *, sync: bool = True) -> Transaction:
        """A locked read-modify-write; `timeout` (seconds) overrides the store's `lock_timeout`.

        With `sync=False` the commit is written but not fsync'd: call
        `sync()` before acting on it or acknowledging it.
        """
        return Transaction(self, self.lock_timeout if timeout is None else timeout, sync)

    def sync(self, generation: int | None = None) -> None:
        """Make every generation up to `generation` (default: the last written) durable.

        Safe to call from another thread while transactions commit: it
        fsyncs whichever state file is current when it starts, which holds
        at least `generation`. A failure poisons the store (see `_poisoned`).
        """
        if getattr(self._in_transaction, "open", False):
            raise StateError("sync() inside a transaction would wait for itself: call it after the block")
        with self._thread_lock:
            self._check_usable()
            target = self._written_generation if generation is None else generation
            if self.durable_generation >= target:
                return
            current = self._written_generation
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as failed:
                self._poison(failed)
        try:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            _fsync_directory(self.directory)
        except OSError as failed:
            with self._thread_lock:
                self._poison(failed)
        with self._thread_lock:
            self.durable_generation = max(self.durable_generation, current)

    def _poison(self, failed: OSError) -> NoReturn:
        """After a failed fsync the kernel may have dropped the dirty pages and cleared the error:
        a retry could "succeed" with nothing on disk. Refuse everything until a restart reads the disk again."""
        self._poisoned = (
            f"could not make the state in {self.directory} durable: {failed.strerror} "
            f"({failed.filename or self.path}). Changes since the last durable generation may be lost; "
            "restart cgd to read what the disk holds"
        )
        raise StateError(self._poisoned) from failed

    def _check_usable(self) -> None:
        if self._poisoned is not None:
            raise StateError(self._poisoned)

    # Reading.

    def _read_locked(self) -> _Loaded:
        self._check_usable()
        last, self._last_commit = self._last_commit, None
        main = self._read_bytes(self.path)
        if last is not None and main == last[0]:
            return _Loaded(last[1], self.path, main, rewrite=False)
        loaded = self._read(main)
        if loaded.generation != self._written_generation:
            self._adopt_disk(loaded)
        return loaded

    def _adopt_disk(self, loaded: _Loaded) -> None:
        """A state this store did not write (first read, or another process committed): make it durable
        once, so the backup rule (only durable files become the backup) holds from here."""
        if loaded.source is not None:
            try:
                fd = os.open(loaded.source, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                _fsync_directory(self.directory)
            except OSError as failed:
                raise StateError(f"cannot make the state in {self.directory} durable: {failed.strerror}") from None
        self._written_generation = self.durable_generation = loaded.generation

    def _read(self, main: bytes | None) -> _Loaded:
        """`main` is the state file's content, None when it does not exist."""
        if main is not None:
            try:
                decoded = self._decode(self.path, main)
            except StateFormatError as bad:
                main_problem = str(bad)
            else:
                if not decoded.checksummed and decoded.migrated_from is None:
                    log.warning("state file %s has no checksum (edited by hand?); it is rewritten with one "
                                "on the next change", self.path)
                rewrite = decoded.migrated_from is not None or not decoded.checksummed
                return _Loaded(decoded.doc, self.path, main, rewrite, decoded.migrated_from)
        else:
            main_problem = "missing"
        backup = self._read_bytes(self.backup_path)
        if backup is None:
            if main is None:
                return _Loaded(StateDoc(), None, seal(0, encode_body(StateDoc())), rewrite=False)
            raise StateCorruptError(
                f"state file {self.path} is unusable ({main_problem}) and its backup {self.backup_path} "
                f"is missing. {_REFUSAL_HINT}"
            )
        try:
            decoded = self._decode(self.backup_path, backup)
        except StateFormatError as bad:
            raise StateCorruptError(
                f"no usable state in {self.directory}: state file {self.path} is unusable ({main_problem}) "
                f"and so is its backup {self.backup_path} ({bad}). {_REFUSAL_HINT}"
            ) from None
        log.warning(
            "state file %s is unusable (%s); loaded its backup %s (generation %d) instead. "
            "The next write keeps the bad file as %s.corrupt-<time> for inspection.",
            self.path, main_problem, self.backup_path, decoded.doc.generation, self.path,
        )
        return _Loaded(decoded.doc, self.backup_path, backup, True, decoded.migrated_from)

    @staticmethod
    def _read_bytes(path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as failed:
            raise StateError(f"cannot read state file {path}: {failed.strerror}") from None

    @staticmethod
    def _decode(path: Path, raw: bytes) -> Decoded:
        try:
            return decode(raw)
        except StateVersionError as newer:
            raise StateVersionError(f"state file {path} was {newer}") from None

    # Locking.

    def _acquire(self, timeout: float) -> None:
        if getattr(self._in_transaction, "open", False):
            raise StateError(
                f"a transaction on {self.directory} is already open in this thread: "
                "do the work inside it instead of opening another"
            )
        timeout = min(timeout, threading.TIMEOUT_MAX)
        deadline = time.monotonic() + timeout
        if not self._thread_lock.acquire(timeout=timeout):
            raise StateLockedError(self._locked_message(timeout, os.getpid(), "another thread of this process"))
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._file_lock.acquire(timeout=max(0.0, deadline - time.monotonic()), poll_interval=_POLL_S)
        except filelock.Timeout:
            self._thread_lock.release()
            raise StateLockedError(self._locked_message(timeout, *self._holder())) from None
        except OSError as failed:
            self._thread_lock.release()
            raise StateError(
                f"cannot lock the state in {self.directory}: {failed.strerror} ({failed.filename}); "
                "only the user running cgd may change it"
            ) from failed
        except BaseException:
            self._thread_lock.release()
            raise
        self._in_transaction.open = True
        try:
            self._holder_path.write_text(f"{os.getpid()}\n")
        except OSError:
            log.debug("could not record the lock holder in %s", self._holder_path, exc_info=True)

    def _release(self) -> None:
        self._in_transaction.open = False
        try:
            self._file_lock.release()
        finally:
            self._thread_lock.release()

    def _holder(self) -> tuple[int | None, str | None]:
        try:
            pid = int(self._holder_path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None, None
        try:
            return pid, psutil.Process(pid).name()
        except psutil.Error:
            return pid, None

    def _locked_message(self, timeout: float, pid: int | None, name: str | None) -> str:
        who = f"pid {pid}" if pid is not None else "another process (pid unknown)"
        if name:
            who += f" ({name})"
        return (
            f"state is locked by {who}: waited {timeout:g}s for {self.lock_path}. "
            "If that process is stuck, stop it: its lock goes with it."
        )

    # Writing.

    def _commit(self, loaded: _Loaded, doc: StateDoc, sync: bool) -> bool:
        generation = loaded.generation
        body = encode_body(doc)
        validated = decode_validated(generation, body, doc)
        payload = seal(generation, body)
        written = loaded.rewrite or payload != loaded.raw
        if written:
            payload = seal(generation + 1, body)
            try:
                self._write(payload, loaded, sync)
            except OSError as failed:
                raise StateError(
                    f"could not commit generation {generation + 1} in {self.directory}: {failed.strerror} "
                    f"({failed.filename}). The change is not acknowledged and nothing may act on it; the next "
                    f"transaction finds generation {generation} or {generation + 1}."
                ) from failed
            validated.generation = doc.generation = generation + 1
            self._written_generation = generation + 1
            if sync:
                self.durable_generation = generation + 1
        if loaded.source is not None or written:
            self._last_commit = (payload, validated)
        return written

    def _write(self, payload: bytes, loaded: _Loaded, sync: bool) -> None:
        staging = self.directory / (STATE_FILE + ".tmp")
        _write_file(staging, payload, sync)
        if loaded.source == self.path:
            if self.durable_generation >= loaded.generation:
                self._keep_backup(loaded.raw)
        elif loaded.source == self.backup_path and self.path.exists():
            os.replace(self.path, _unused(self.directory / f"{STATE_FILE}.corrupt-{_stamp()}"))
        if loaded.migrated_from is not None:
            old = self.directory / f"{STATE_FILE}.v{loaded.migrated_from}"
            if not old.exists():
                _write_file(old, loaded.raw)
        os.replace(staging, self.path)
        if sync:
            _fsync_directory(self.directory)

    def _keep_backup(self, previous: bytes) -> None:
        """The state file about to be replaced becomes the backup; it is never written in place, so a link is a copy."""
        staging = self.directory / (BACKUP_FILE + ".tmp")
        staging.unlink(missing_ok=True)
        try:
            os.link(self.path, staging)
        except OSError as failed:
            if failed.errno not in _NO_HARD_LINKS:
                raise
            _write_file(staging, previous)
        os.replace(staging, self.backup_path)


class Transaction:
    """One locked read-modify-write of the state.

    `with store.transaction() as doc:` takes the lock, loads the state and
    hands over the document to change in place; `txn.doc = other` replaces it
    whole. On a normal exit the document is validated, its generation bumped
    and the file written durably before the `with` statement ends, so whatever
    the caller does next (spawning a process) never runs ahead of the disk;
    with `sync=False` it is written before the block ends and made durable by
    the store's `sync()`, which must come before anything acts on it.
    An exception inside the block writes nothing. A document that did not
    change is not written and keeps its generation (see `written`). The
    caller never sets `generation` or `schema_version`: the store does.
    """

    def __init__(self, store: StateStore, timeout: float, sync: bool = True) -> None:
        self._store = store
        self._timeout = timeout
        self._sync = sync
        self._loaded: _Loaded | None = None
        self._doc: StateDoc | None = None
        self._used = False
        self.committed: StateDoc | None = None
        """After a successful exit: the document as committed, with its new generation (the caller's own object)."""
        self.written = False
        """After a successful exit: whether a new generation reached the disk."""

    @property
    def doc(self) -> StateDoc:
        """The document being changed; only while the transaction is open."""
        if self._doc is None:
            raise StateError("the transaction is not open")
        return self._doc

    @doc.setter
    def doc(self, new: StateDoc) -> None:
        if self._doc is None:
            raise StateError("the transaction is not open")
        if not isinstance(new, StateDoc):
            raise TypeError(f"a transaction holds a StateDoc, not {type(new).__name__}")
        self._doc = new

    @property
    def generation(self) -> int:
        """The committed generation after the block, the loaded one inside it."""
        if self.committed is not None:
            return self.committed.generation
        return self.doc.generation

    def __enter__(self) -> StateDoc:
        if self._used:
            raise StateError("a transaction can be entered only once; open a new one")
        self._used = True
        self._store._acquire(self._timeout)
        try:
            self._loaded = self._store._read_locked()
        except BaseException:
            self._store._release()
            raise
        self._doc = self._loaded.doc
        return self._doc

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if exc_type is None and self._loaded is not None and self._doc is not None:
                self.written = self._store._commit(self._loaded, self._doc, self._sync)
                self.committed = self._doc
        finally:
            self._doc = None
            self._store._release()


def missing_gpus(doc: StateDoc, gpu_uuids: Iterable[str]) -> tuple[str, ...]:
    """GPUs the state knows (fingerprint or groups) that are not on the machine now, in first-seen order."""
    present = set(gpu_uuids)
    known = list(doc.machine.gpu_uuids) if doc.machine else []
    known += [device.gpu_uuid for group in doc.groups.values() for device in group.devices]
    return tuple(uuid for uuid in dict.fromkeys(known) if uuid not in present)


def mark_lost(doc: StateDoc, gpu_uuids: Iterable[str], mig_uuids: Iterable[str] | None = None) -> StateDoc:
    """Mark `lost` every group of `doc` on a GPU (or MIG device) that is not present; returns `doc`.

    Meant for the open document of a transaction, so it changes `doc` in
    place like every other decision of the manager. Lost groups are kept,
    never dropped: their owners must see what happened (`cgctl status`) and
    the manager decides what becomes of them. Groups whose GPUs came back
    stay lost until the manager says otherwise. MIG devices are only checked
    when `mig_uuids` is given, so a caller that knows only the GPUs does not
    lose every MIG group.
    """
    present = set(gpu_uuids)
    present_mig = None if mig_uuids is None else set(mig_uuids)
    for gid, group in doc.groups.items():
        gone = [
            device for device in group.devices
            if device.gpu_uuid not in present
            or (present_mig is not None and device.mig_uuid is not None and device.mig_uuid not in present_mig)
        ]
        if gone and group.state != GroupState.LOST:
            device = gone[0]
            what = f"MIG device {device.mig_uuid} on " if device.gpu_uuid in present else ""
            reason = f"lost: {what}GPU {device.gpu_index} ({device.gpu_uuid}) is no longer on this machine"
            explanation = f"{reason}; before: {group.explanation}" if group.explanation else reason
            doc.groups[gid] = msgspec.structs.replace(group, state=GroupState.LOST, explanation=explanation)
    return doc


_REFUSAL_HINT = (
    "Refusing to start from an empty state, which would forget every allocation. Inspect the files; "
    "restore a good copy as state.json (a hand-edited file needs its \"checksum\" key removed), or move the "
    "directory aside to really start empty."
)


def _write_file(path: Path, payload: bytes, sync: bool = True) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_directory(directory: Path) -> None:
    """Makes the renames themselves durable: without it a power cut can bring back the old file."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _unused(path: Path) -> Path:
    candidate, n = path, 1
    while candidate.exists():
        candidate, n = path.with_name(f"{path.name}.{n}"), n + 1
    return candidate
