"""A gate on the fsync of cgd's state journal, for end-to-end tests of what waits for it.

A test starts cgd with `env()` added to its environment: the folder's
`sitecustomize.py` is then loaded by cgd's interpreter and wraps `os.fsync`
of the state journal. The test holds, fails or lets the fsync go by files;
cgd's own code is not changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.daemon_fixture import wait_for

HOOK = Path(__file__).resolve().parent


@dataclass(frozen=True)
class FsyncGate:
    folder: Path

    def env(self) -> dict[str, str]:
        self.folder.mkdir(parents=True, exist_ok=True)
        return {"PYTHONPATH": str(HOOK), "CG_TEST_FSYNC_GATE": str(self.folder)}

    def hold(self) -> None:
        """From now on an fsync of the journal waits until `release()`."""
        (self.folder / "held").unlink(missing_ok=True)
        (self.folder / "hold").touch()

    def wait_held(self, timeout: float = 10.0) -> None:
        """Return once an fsync of the journal is waiting at the gate."""
        wait_for((self.folder / "held").exists, "an fsync of the state journal held at the gate", timeout)

    def release(self) -> None:
        (self.folder / "hold").unlink(missing_ok=True)

    def fail(self) -> None:
        """From now on an fsync of the journal fails with EIO."""
        (self.folder / "fail").touch()

    def heal(self) -> None:
        """The fsyncs of the journal work again."""
        (self.folder / "fail").unlink(missing_ok=True)

    def synced(self) -> int:
        """How many fsyncs of the journal have returned."""
        try:
            return len((self.folder / "synced").read_text().splitlines())
        except FileNotFoundError:
            return 0
