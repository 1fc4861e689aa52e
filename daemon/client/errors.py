"""What can go wrong between a client and cgd, as types a caller can act on.

Library code raises these; only `cgctl` turns them into one line and an exit
code, so a Python caller can tell "start the daemon" from "ask for less".
"""

from __future__ import annotations

from pathlib import Path

START_HINT = "start it with `cgd` or `systemctl start computegroups`"


class ClientError(Exception):
    """Base of every error the client raises."""


class CgdUnreachable(ClientError):
    """The socket is there but cgd could not be asked (permissions, time-out)."""

    def __init__(self, socket_path: Path | str, reason: str) -> None:
        self.socket_path = Path(socket_path)
        self.reason = reason
        super().__init__(self._describe())

    def _describe(self) -> str:
        return f"cannot reach cgd at {self.socket_path}: {self.reason}"


class CgdNotRunning(CgdUnreachable):
    """No daemon listens on the socket: the fix is always to start one.

    `stale` tells a socket file left by a daemon that died from no file at all.
    """

    def __init__(self, socket_path: Path | str, stale: bool = False) -> None:
        self.stale = stale
        super().__init__(socket_path, "nothing listens on the socket" if stale else "no socket")

    def _describe(self) -> str:
        return f"cgd is not running ({self.reason} at {self.socket_path}): {START_HINT}"


class CgdStopping(CgdUnreachable):
    """cgd answered 503 `stopping`: it is going away (a restart, most often) and cut the request short.

    A reachability error, not a refusal: whoever waits for cgd to come back
    after a refused connection (a long poll, a follower) waits here too."""


class CgdError(ClientError):
    """cgd answered and refused: `code` is the stable part of docs/api.md's error table."""

    def __init__(self, status: int, code: str, message: str) -> None:
        self.status = status
        self.code = code
        self.message = message
        super().__init__(message)

    def __repr__(self) -> str:
        return f"CgdError({self.status}, {self.code!r}, {self.message!r})"
