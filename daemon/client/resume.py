"""Following cgd across its restarts: where to pick up, and how long to wait first.

A follower's stream ends when cgd stops and breaks when cgd dies; both
clients' `events(follow=True)` then connect again, with `since` the last
event they handed out, so nothing cgd still keeps is missed and cgd's own
`gap` event says what it did not keep (a restart starts a new epoch). The
decisions (the cursor, when to give up, the waits, the one note per
outage) live here once; the blocking and the async client differ only in
how they read a stream and how they wait. `cgctl logs -f`, which polls
rather than streams, shares the waits and the note (`Reconnect`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from computegroups.daemon.client.errors import CgdUnreachable

BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)
"""The waits before each try to reach cgd again, the last one repeated: a restart is seen within
two seconds of cgd answering, and a cgd that stays away costs one connection attempt every two."""

Note = Callable[[str], None]


class Reconnect:
    """A follower's count of failed tries since it was last connected, and its one note per outage.

    What every follower of cgd shares (`events(follow=True)` through `Resume`,
    `cgctl logs -f`): `describe` words the note from the error that ended the
    connection (None: cgd ended the stream itself, as when it stops)."""

    def __init__(self, note: Note | None, describe: Callable[[CgdUnreachable | None], str]) -> None:
        self.note = note
        self._describe = describe
        self._connected = False
        self._tries = 0
        self._noted = False

    def opened(self) -> None:
        """cgd answered: the next outage is a new one, its waits start short."""
        self._connected = True
        self._tries = 0
        self._noted = False

    def retry(self, error: CgdUnreachable | None) -> float:
        """The seconds to wait before connecting again, after the stream ended (`error` None) or
        could not be read. Raises `error` if cgd never answered this follower: a cgd that was not
        there to begin with is the caller's to hear about, not to wait for."""
        if error is not None and not self._connected:
            raise error
        if not self._noted and self.note is not None:
            self._noted = True
            self.note(self._describe(error))
        wait = BACKOFF_S[min(self._tries, len(BACKOFF_S) - 1)]
        self._tries += 1
        return wait


class Resume(Reconnect):
    """One event follower's place in the stream, and its outages (`Reconnect`)."""

    def __init__(self, since: int | None, note: Note | None = None) -> None:
        super().__init__(note, self._lost)
        self.since = since
        """The `since` of the next connection: the last event handed out, or the caller's own."""

    def seen(self, event: dict[str, Any]) -> None:
        """`event` is handed out; a `gap` has no number and leaves the place where it is."""
        if event.get("seq") is not None:
            self.since = event["seq"]

    def _lost(self, error: CgdUnreachable | None) -> str:
        where = "from the start" if self.since is None else f"after {self.since}"
        return f"cgd's events {'ended' if error is None else 'broke off'}; reconnecting to read {where}"
