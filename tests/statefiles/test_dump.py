"""`python -m computegroups.statefiles DIR` prints what cgd would load: the snapshot with the journal replayed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from computegroups.statefiles import StateStore
from tests.statefiles.samples import commit, edit, populated_doc


def dump(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "computegroups.statefiles", *args],
                          capture_output=True, text=True, timeout=60)


def test_the_dump_holds_the_changes_in_the_journal(journaled: StateStore) -> None:
    commit(journaled, populated_doc())
    with journaled.transaction() as doc:
        edit(doc.groups, "web-1", state="degraded")
    assert journaled.journal_path.exists() and not journaled.path.exists(), "no snapshot yet: only the journal"
    done = dump(str(journaled.directory))
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["generation"] == 2 and data["groups"]["web-1"]["state"] == "degraded"
    assert dump(str(journaled.directory), "--generation").stdout == "2\n"


def test_a_directory_that_is_not_there_is_an_error(tmp_path: Path) -> None:
    done = dump(str(tmp_path / "nowhere"))
    assert done.returncode == 1 and done.stderr.strip().endswith(f"no state directory at {tmp_path / 'nowhere'}")


def test_a_damaged_state_is_an_error_with_the_reason(store: StateStore) -> None:
    commit(store, populated_doc())
    store.path.write_bytes(b"{ not json")
    done = dump(str(store.directory))
    assert done.returncode == 1 and "is unusable" in done.stderr and done.stdout == ""


def test_a_torn_last_entry_is_left_out_with_a_note(journaled: StateStore) -> None:
    commit(journaled, populated_doc())
    with journaled.journal_path.open("ab") as journal:
        journal.write(b'{"schema_version": 3, "generation": 2, "dra')
    done = dump(str(journaled.directory), "--generation")
    assert done.returncode == 0 and done.stdout == "1\n"
    assert "ends in an incomplete entry" in done.stderr and str(journaled.journal_path) in done.stderr
    assert journaled.journal_path.read_bytes().endswith(b'"dra'), "a reader writes nothing"


def test_without_a_directory_it_says_which_state_it_read(journaled: StateStore) -> None:
    commit(journaled, populated_doc())
    done = subprocess.run([sys.executable, "-m", "computegroups.statefiles", "--generation"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "CG_STATE_DIR": str(journaled.directory)})
    assert done.returncode == 0 and done.stdout == "1\n", done.stderr
    assert done.stderr == f"python -m computegroups.statefiles: the state in {journaled.directory}\n"
    assert dump(str(journaled.directory), "--generation").stderr == ""
