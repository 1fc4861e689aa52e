"""The state directory on disk: locked transactions, a journal of changes, snapshots, a backup.

A commit goes: lock, read (or reuse what this store last wrote, when the
files are still exactly as it left them), let the caller decide, append one
checksummed line holding what changed to `state.journal` (see journal.py),
fsync it. Its cost follows the size of the change, not of the state. Every
`snapshot_every` entries the whole document is written as a snapshot: to a
temporary file, fsync'd, the previous snapshot kept as the backup (a hard
link), renamed over `state.json`, the journal it holds moved aside as
`state.journal.bak` (the backup's journal), the directory fsync'd. Loading replays the journals on the
snapshot. A reader takes no lock: it reads the journals before the snapshot,
so a snapshot written meanwhile only makes it skip entries it already has.

Every generation is one journal line, a rewrite that changes nothing too,
so the backup and the journals after it reach every change. A commit that
fails before its snapshot takes its name cuts its line off again: no later
load finds a change its caller was told is refused.

A commit may leave its fsync to a later `sync()` (`transaction(sync=False)`),
so that changes committed while one fsync runs share the next (group
commit). Until then the change is visible but not durable: nothing may act
on it, and nothing calls it durable without an fsync that covers it. A
crash may lose the unsynced entries or leave the last of them torn; a torn
last line is dropped loudly. None of them was acknowledged.

Loading never makes up an empty state: only a directory with neither the
state file nor its backup is new. A bad state file falls back to the backup
and the journal that followed it, with a warning naming both; two bad files
are a refusal.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import NoReturn

import filelock
import msgspec
import psutil

from computegroups.daemon.model.enums import GroupState
from computegroups.statefiles import journal
from computegroups.statefiles.errors import (
    StateCorruptError,
    StateError,
    StateFormatError,
    StateLockedError,
    StateVersionError,
)
from computegroups.statefiles.fileformat import Decoded, decode, encode_body, seal
from computegroups.statefiles.fileformat import validated as decode_validated
from computegroups.statefiles.schema import SCHEMA_VERSION, StateDoc

log = logging.getLogger(__name__)

STATE_FILE = "state.json"
BACKUP_FILE = "state.json.bak"
LOCK_FILE = "state.lock"
SNAPSHOT_EVERY = 1000
"""Journal entries between snapshots: a start replays at most this many, a snapshot costs one whole write."""
_JOURNAL_MAX_BYTES = 64 << 20
"""A snapshot also comes once the journal is this large (entries of big deployments)."""
_POLL_S = 0.01
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS}

_Stamp = tuple[tuple[int, int, int] | None, tuple[int, int] | None]
"""What the snapshot (inode, size, mtime) and the journal (inode, size) were when this store last saw them."""


@dataclass
class _Snapshot:
    """The snapshot a state was loaded from."""

    doc: StateDoc
    source: Path | None
    """The file it came from; None for a new state."""
    raw: bytes | None
    rewrite: bool
    """Write a snapshot with the next change: it came from the backup, an older schema or a hand edit."""
    migrated_from: int | None = None


@dataclass
class _Loaded:
    """What a transaction started from: the store's own copy, and the one handed to the caller."""

    base: StateDoc
    """The store's document; the change is what the caller's differs from it by."""
    doc: StateDoc
    """The caller's: its maps are its own, its records (frozen) shared with `base`."""
    snapshot: _Snapshot | None
    """Set when this transaction read the disk; None when the store reused its own document."""

    @property
    def generation(self) -> int:
        return self.base.generation

    @property
    def rewrite(self) -> bool:
        return self.snapshot is not None and self.snapshot.rewrite


class StateStore:
    """The one state directory of a daemon. Only the manager opens transactions; anyone may `load()`."""

    def __init__(self, directory: str | os.PathLike[str], lock_timeout: float = 10.0,
                 snapshot_every: int = SNAPSHOT_EVERY) -> None:
        if lock_timeout < 0:
            raise ValueError(f"lock_timeout must be >= 0 seconds, got {lock_timeout}")
        if snapshot_every < 1:
            raise ValueError(f"snapshot_every must be >= 1, got {snapshot_every}")
        self.directory = Path(directory)
        self.lock_timeout = lock_timeout
        self.snapshot_every = snapshot_every
        self.path = self.directory / STATE_FILE
        self.backup_path = self.directory / BACKUP_FILE
        self.journal_path = self.directory / journal.JOURNAL_FILE
        self.journal_backup_path = self.directory / journal.JOURNAL_BACKUP
        self.lock_path = self.directory / LOCK_FILE
        self._file_lock = filelock.FileLock(str(self.lock_path), mode=0o600)
        self._thread_lock = threading.Lock()
        self._held = False
        """The file lock is kept between transactions (`hold`)."""
        self._made = False
        self._in_transaction = threading.local()
        self.durable_generation = -1
        """The newest generation known to be on disk (fsync'd, file and directory); -1 until the first read."""
        self._written_generation = -1
        self._poisoned: str | None = None
        """Why the store refuses every change: an fsync failed, and what the disk holds is no longer known."""
        self._current: StateDoc | None = None
        """The document as this store last committed or read it, while `_stamp` says the files are unchanged."""
        self._stamp: _Stamp | None = None
        self._journal_fd: int | None = None
        self._journal_entries = 0
        self._journal_bytes = 0
        self._directory_dirty = False
        """A name changed in the directory (a journal created) that no fsync of it has covered yet."""

    def __repr__(self) -> str:
        return f"StateStore({str(self.directory)!r})"

    def close(self) -> None:
        """Let go of the journal's file descriptor (the next transaction opens it again), fsync'ing first
        what is written and not yet durable; a failure of that fsync is a StateError, as from `sync()`."""
        with self._thread_lock:
            self._close_journal()

    def load(self) -> StateDoc:
        """The last committed state, without taking the lock."""
        for _ in range(20):
            try:
                return self._read_disk(locked=False)[0]
            except _Raced:
                continue  # a snapshot replaced the journals while they were read: read again
        return self._read_disk(locked=False, last_try=True)[0]

    def transaction(self, timeout: float | None = None, *, sync: bool = True) -> Transaction:
        """A locked read-modify-write; `timeout` (seconds) overrides the store's `lock_timeout`.

        With `sync=False` the change is written but not fsync'd: call
        `sync()` before acting on it or acknowledging it.
        """
        return Transaction(self, self.lock_timeout if timeout is None else timeout, sync)

    def sync(self, generation: int | None = None) -> None:
        """Make every generation up to `generation` (default: the last written) durable.

        Safe to call from another thread while transactions commit: it
        fsyncs the journal that is current when it starts, which holds at
        least `generation`. A failure poisons the store (see `_poisoned`).
        """
        if getattr(self._in_transaction, "open", False):
            raise StateError("sync() inside a transaction would wait for itself: call it after the block")
        with self._thread_lock:
            self._check_usable()
            target = self._written_generation if generation is None else generation
            if self.durable_generation >= target:
                return
            current = self._written_generation
            directory = self._directory_dirty
            self._directory_dirty = False
            try:
                fd = None if self._journal_fd is None else os.dup(self._journal_fd)
            except OSError as failed:
                self._poison(failed)
        try:
            if fd is not None:
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            if directory:
                _fsync_directory(self.directory)
        except OSError as failed:
            with self._thread_lock:
                self._poison(failed)
        with self._thread_lock:
            # Another fsync of the same journal (a snapshot's, a close's) may have failed meanwhile and
            # taken the error this one would have seen: once poisoned, nothing more is called durable.
            self._check_usable()
            self.durable_generation = max(self.durable_generation, current)

    def _poison(self, failed: OSError, what: str | None = None) -> NoReturn:
        """After a failed fsync the kernel may have dropped the dirty pages and cleared the error:
        a retry could "succeed" with nothing on disk. Refuse everything until a restart reads the disk again."""
        what = what or f"changes after generation {self.durable_generation} may or may not be on disk"
        self._poisoned = (
            f"could not make the state in {self.directory} durable: {failed.strerror} "
            f"({failed.filename or self.journal_path}). {what}; restart cgd to read what the disk holds"
        )
        raise StateError(self._poisoned) from failed

    @property
    def refusal(self) -> str | None:
        """Why the store refuses every change (an fsync failed: see `_poison`); None while it takes them."""
        return self._poisoned

    def _check_usable(self) -> None:
        if self._poisoned is not None:
            raise StateError(self._poisoned)

    # Reading.

    def _read_locked(self) -> _Loaded:
        self._check_usable()
        if self._current is not None and self._stamp == self._disk_stamp():
            return _Loaded(self._current, journal.owned(self._current), None)
        self._close_journal()
        doc, snapshot, entries = self._read_disk(locked=True)
        self._current = doc
        self._journal_entries = entries
        self._adopt_disk()
        return _Loaded(doc, journal.owned(doc), snapshot)

    def _read_disk(self, locked: bool, last_try: bool = False) -> tuple[StateDoc, _Snapshot, int]:
        """The snapshot with the journals replayed on it, and how many entries the current journal holds.

        The journals are read first: a snapshot that replaces them meanwhile
        holds everything they did.
        """
        journals = self._journal_inodes()
        older = self._read_journal(self.journal_backup_path, locked=False)
        newer = self._read_journal(self.journal_path, locked=locked)
        snapshot = self._read(self._read_bytes(self.path))
        if not locked and not last_try and self._journal_inodes() != journals:
            raise _Raced  # a snapshot moved the journal aside while it was read: its entries may be in neither
        doc = snapshot.doc
        where = f"state in {self.directory}"
        try:
            journal.replay(doc, [*older, *newer], where)
        except StateCorruptError:
            if locked or last_try:
                raise
            raise _Raced from None
        return doc, snapshot, len(newer)

    def _journal_inodes(self) -> tuple[int | None, int | None]:
        return _inode(self.journal_backup_path), _inode(self.journal_path)

    def _read_journal(self, path: Path, locked: bool) -> list[journal.Entry]:
        raw = self._read_bytes(path)
        if raw is None:
            return []
        parsed = journal.parse(raw, str(path))
        if parsed.torn is not None:
            if locked:
                self._cut_torn_tail(path, raw, parsed)
            else:
                # Not a warning: without the lock, this may be an entry being appended at this very moment.
                log.info("journal %s ends in an incomplete entry (%s): left out. It is being written now, or a "
                         "crash cut it short before it was acknowledged (then cgd sets it aside when it starts)",
                         path, parsed.torn)
        return list(parsed.entries)

    def _cut_torn_tail(self, path: Path, raw: bytes, parsed: journal.Parsed) -> None:
        """What a crash left at the end of the journal was never acknowledged: keep it aside, then cut it,
        so the next entry follows a whole line."""
        aside = _unused(self.directory / f"{path.name}.corrupt-{_stamp()}")
        log.warning("journal %s ends in a damaged entry (%s), left by a crash before it was acknowledged; "
                    "dropped (kept as %s)", path, parsed.torn, aside)
        try:
            _create(aside, raw[parsed.good_length:])
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.ftruncate(fd, parsed.good_length)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as failed:
            raise StateError(f"cannot cut the damaged end of {path}: {failed.strerror}") from None

    def _adopt_disk(self) -> None:
        """A state this store did not write (first read, or another process committed): make it durable
        once, so what it builds on is on disk."""
        try:
            for path in (self.path, self.journal_path):
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            if self.directory.exists():
                _fsync_directory(self.directory)
        except OSError as failed:
            # As any failed fsync: what the disk holds is not known, and `durable_generation` stays
            # below the document's, which no later `sync()` could raise (it has nothing of its own to fsync).
            read, self._current, self._stamp = self._current, None, None
            generation = read.generation if read is not None else "unknown"
            self._poison(failed, f"the state read from it (generation {generation}) may not be all on disk")
        assert self._current is not None
        self._written_generation = self.durable_generation = self._current.generation
        self._stamp = self._disk_stamp()
        self._journal_bytes = self._stamp[1][1] if self._stamp[1] else 0

    def _disk_stamp(self) -> _Stamp:
        try:
            main = os.stat(self.path)
            snapshot: tuple[int, int, int] | None = (main.st_ino, main.st_size, main.st_mtime_ns)
        except FileNotFoundError:
            snapshot = None
        try:
            log_ = os.stat(self.journal_path)
            entries: tuple[int, int] | None = (log_.st_ino, log_.st_size)
        except FileNotFoundError:
            entries = None
        return snapshot, entries

    def _read(self, main: bytes | None) -> _Snapshot:
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
                return _Snapshot(decoded.doc, self.path, main, rewrite, decoded.migrated_from)
        else:
            main_problem = "missing"
        backup = self._read_bytes(self.backup_path)
        if backup is None:
            if main is None:
                return _Snapshot(StateDoc(), None, None, rewrite=False)
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
            "state file %s is unusable (%s); loaded its backup %s (generation %d) and the journal after it "
            "instead. The next write keeps the bad file as %s.corrupt-<time> for inspection.",
            self.path, main_problem, self.backup_path, decoded.doc.generation, self.path,
        )
        return _Snapshot(decoded.doc, self.backup_path, backup, True, decoded.migrated_from)

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

    def hold(self, timeout: float | None = None) -> None:
        """Keep the file lock from now until `let_go()`, for the one process that owns the state
        while it runs: cgd, whose instance lock already keeps a second cgd out. Each transaction
        then takes only the thread lock: filelock's acquire and release cost about 55 µs, a
        quarter of a commit (docs/performance.md). A writer in another process waits for the
        holder to exit, as it would for a long transaction; readers take no lock and see no change."""
        self._acquire(self.lock_timeout if timeout is None else timeout)
        self._held = True
        self._in_transaction.open = False
        self._thread_lock.release()

    def let_go(self) -> None:
        """The end of `hold()`: the next writer, in any process, may lock the state."""
        with self._thread_lock:
            if self._held:
                self._held = False
                self._file_lock.release()

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
            if not self._made:  # once: a commit should not pay a system call for a directory that exists
                self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                self._made = True
            if not self._held:
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

    def _release(self) -> None:
        self._in_transaction.open = False
        try:
            if not self._held:
                self._file_lock.release()
        finally:
            self._thread_lock.release()

    def _holder(self) -> tuple[int | None, str | None]:
        """Who holds the lock, as the kernel says (/proc/locks), so nothing is written per transaction
        to remember it and no record of it can go stale."""
        try:
            pid = lock_holder(self.lock_path)
        except OSError:
            return None, None
        if pid is None:
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
        doc.schema_version = SCHEMA_VERSION
        entry = journal.diff(loaded.base, doc, generation + 1)
        if entry is None:
            if not loaded.rewrite:
                doc.generation = generation
                return False
            # Every generation is a journal line, a rewrite that changes nothing too: the backup and the
            # journals after it then reach every generation, whatever the snapshots were.
            entry = journal.Entry(schema_version=SCHEMA_VERSION, generation=generation + 1)
        line = journal.encode(entry)
        snapshot = (loaded.rewrite or self._journal_entries + 1 >= self.snapshot_every
                    or self._journal_bytes >= _JOURNAL_MAX_BYTES)
        payload = self._snapshot_payload(doc, generation + 1) if snapshot else None
        start: int | None = None
        try:
            fd = self._journal()
            start = self._journal_bytes
            _write_all(fd, line)
            if sync or payload is not None:
                # Before a snapshot too: the journal it moves aside is what the backup's chain relies on.
                self._fsync_journal(directory=payload is None)
            if payload is not None:
                self._write_snapshot(payload, loaded.snapshot)
        except BaseException as failed:
            # Failed before the snapshot took its name: the disk goes back to `generation`.
            self._current = self._stamp = None
            self._close_journal(cut_to=start)
            if self._poisoned is not None or not isinstance(failed, OSError):
                raise
            raise StateError(
                f"could not commit generation {generation + 1} in {self.directory}: {failed.strerror} "
                f"({failed.filename or self.journal_path}). The change is not acknowledged and nothing may act "
                f"on it; the state stays at generation {generation}."
            ) from failed
        self._journal_bytes += len(line)
        self._journal_entries += 1
        if payload is not None:
            self._rotate_journal(generation + 1, loaded.snapshot)
        else:
            assert self._stamp is not None and self._journal_fd is not None
            self._stamp = (self._stamp[0], (os.fstat(self._journal_fd).st_ino, self._journal_bytes))
        doc.generation = generation + 1
        journal.apply(loaded.base, entry)
        self._current = loaded.base
        self._written_generation = generation + 1
        if payload is not None or sync:
            self.durable_generation = generation + 1
        return True

    def _fsync_journal(self, directory: bool) -> None:
        """fsync the journal (and, with `directory`, a new journal's name); a failure poisons the store."""
        assert self._journal_fd is not None
        try:
            os.fsync(self._journal_fd)
            if directory and self._directory_dirty:
                _fsync_directory(self.directory)
                self._directory_dirty = False
        except OSError as failed:
            self._poison(failed)

    def _journal(self) -> int:
        if self._journal_fd is None:
            flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                self._journal_fd = os.open(self.journal_path, flags)
            except FileNotFoundError:
                self._journal_fd = os.open(self.journal_path, flags | os.O_CREAT | os.O_EXCL, 0o600)
                self._directory_dirty = True
            self._journal_bytes = os.fstat(self._journal_fd).st_size
        return self._journal_fd

    def _close_journal(self, cut_to: int | None = None) -> None:
        """Let go of the journal's descriptor; a failure poisons the store.

        It is fsync'd first when it holds entries not yet durable, since
        `sync()` finds no descriptor to fsync afterwards and must not take
        their durability on trust; and when `cut_to` cuts off the line of a
        commit that failed, which may be whole and even fsync'd: no later
        load may find a change its caller was told is refused.
        """
        fd, self._journal_fd = self._journal_fd, None
        if fd is None:
            return
        try:
            if cut_to is not None:
                os.ftruncate(fd, cut_to)
            if self._poisoned is None and (cut_to is not None or self._written_generation > self.durable_generation):
                os.fsync(fd)
                if self._directory_dirty:
                    _fsync_directory(self.directory)
                    self._directory_dirty = False
                self.durable_generation = max(self.durable_generation, self._written_generation)
        except OSError as failed:
            if self._poisoned is None:
                self._poison(failed)
        finally:
            os.close(fd)

    def _snapshot_payload(self, doc: StateDoc, generation: int) -> bytes:
        body = encode_body(doc)
        decode_validated(generation, body, doc)
        return seal(generation, body)

    def _write_snapshot(self, payload: bytes, read: _Snapshot | None) -> None:
        """The whole document as the new `state.json`. The order keeps, at every instant, the backup and
        the journals after it holding every entry since the backup, and the journals holding every entry
        since the snapshot: the journal is moved aside only once the snapshot that holds it has its name."""
        staging = self.directory / (STATE_FILE + ".tmp")
        staging.unlink(missing_ok=True)  # left by a crash, or planted
        _create(staging, payload)
        source = self.path if read is None else read.source
        if source == self.path and self.path.exists():
            self._keep_backup()
        elif source == self.backup_path and self.path.exists():
            os.replace(self.path, _unused(self.directory / f"{STATE_FILE}.corrupt-{_stamp()}"))
        if read is not None and read.migrated_from is not None and read.raw is not None:
            old = self.directory / f"{STATE_FILE}.v{read.migrated_from}"
            with contextlib.suppress(FileExistsError):  # the first upgrade's original is the one kept
                _create(old, read.raw)
        os.replace(staging, self.path)

    def _rotate_journal(self, generation: int, read: _Snapshot | None) -> None:
        """After the snapshot took its name: move the journal it holds aside and make the renames durable.
        The commit is on disk now and cannot be taken back, so a failure poisons the store.

        A snapshot made from the backup (the state file was bad) kept that
        backup, whose journal `state.journal.bak` still is: then the current
        journal stays where it is, holding what came after that one, and the
        backup reaches every change through both. The next snapshot, made
        from this one, moves it aside as usual.
        """
        from_backup = read is not None and read.source == self.backup_path
        try:
            self._close_journal()
            if not from_backup and self.journal_path.exists():
                os.replace(self.journal_path, self.journal_backup_path)
            _fsync_directory(self.directory)
        except OSError as failed:
            self._current = self._stamp = None
            self._poison(failed, f"generation {generation} is written but may not be on disk")
        self._directory_dirty = False
        if not from_backup:
            self._journal_entries = self._journal_bytes = 0
        self._stamp = self._disk_stamp()

    def _keep_backup(self) -> None:
        """The snapshot about to be replaced becomes the backup; it is never written in place, so a link is a copy."""
        staging = self.directory / (BACKUP_FILE + ".tmp")
        staging.unlink(missing_ok=True)
        try:
            os.link(self.path, staging)
        except OSError as failed:
            if failed.errno not in _NO_HARD_LINKS:
                raise
            _create(staging, self.path.read_bytes())
        os.replace(staging, self.backup_path)


class _Raced(Exception):
    """A reader without the lock saw journals from two different snapshots."""


class Transaction:
    """One locked read-modify-write of the state.

    `with store.transaction() as doc:` takes the lock, loads the state and
    hands over the document to change: its maps (`doc.groups`, ...) are the
    transaction's own; its records are frozen values, changed by putting a
    new one in their place (`doc.groups[gid] = replace(group, state=...)`).
    `txn.doc = other` replaces the document whole. On a normal exit what
    changed is validated, the generation bumped and the change written
    durably before the `with` statement ends, so whatever the caller does
    next (spawning a process) never runs ahead of the disk; with
    `sync=False` it is written before the block ends and made durable by
    the store's `sync()`, which must come before anything acts on it. An
    exception inside the block writes nothing. A document that did not
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


def replace_file(path: Path, payload: bytes) -> None:
    """Put `payload` at `path` durably and safely, for the small files cgd keeps beside the state
    (the event epoch): a new file made as `_create` makes one, renamed over the old name, the
    rename fsync'd. A link planted at either name is replaced, never followed."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    _create(tmp, payload)
    os.replace(tmp, path)
    _fsync_directory(path.parent)


def _create(path: Path, payload: bytes) -> None:
    """A new file of the state directory, written and fsync'd; removed again if that fails (on a full disk,
    the room is given back).

    cgd writes here as root: O_EXCL|O_NOFOLLOW never follows a name planted
    in the directory (a link to a file elsewhere) and never writes into a file
    it did not create; 0600 because component specs may hold secrets.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        _write_all(fd, payload)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)


def _write_all(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view):]


def _fsync_directory(directory: Path) -> None:
    """Makes the renames themselves durable: without it a power cut can bring back the old file."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _unused(path: Path) -> Path:
    candidate, n = path, 1
    while os.path.lexists(candidate):
        candidate, n = path.with_name(f"{path.name}.{n}"), n + 1
    return candidate


def lock_holder(path: Path) -> int | None:
    """The pid holding a flock on `path`, from /proc/locks (device and inode); None when none is listed.

    A holder in another pid namespace is listed as 0 or not at all: then it is unknown.
    """
    st = os.stat(path)
    wanted = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with open("/proc/locks", encoding="ascii", errors="replace") as locks:
        for line in locks:
            fields = line.split()
            if len(fields) >= 6 and fields[1] == "FLOCK" and "->" not in fields and fields[5] == wanted:
                pid = int(fields[4])
                return pid or None
    return None
