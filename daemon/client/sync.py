"""The blocking client `cgctl` uses: one short exchange per call on the socket.

No event loop and nothing beyond `socket` and `json`, because cgctl starts
once per command and its start-up time is what a user feels.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from computegroups.daemon.client.endpoints import Endpoints
from computegroups.daemon.client.errors import CgdNotRunning, CgdUnreachable
from computegroups.daemon.client.locate import client_socket_path
from computegroups.daemon.client.wire import BrokenAnswer, Request, decode_answer, parse_answer

DEFAULT_TIMEOUT_S = 60.0


class CgdClient(Endpoints[Any]):
    """Talks to one cgd; every method returns the decoded JSON answer.

    The socket is chosen like cgd chooses it (`--socket`, `$CG_SOCKET`, the
    mode's default) so both ends agree without configuration.
    """

    def __init__(self, socket_path: str | os.PathLike[str] | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.socket_path = client_socket_path(socket_path)
        self.timeout = timeout

    def send(self, request: Request) -> Any:
        try:
            raw = self._exchange(request.encode())
            status, payload = parse_answer(raw)
        except OSError as exc:
            raise connection_error(self.socket_path, exc, self.timeout) from None
        except BrokenAnswer as exc:
            raise CgdUnreachable(self.socket_path, f"broken answer: {exc}") from None
        return decode_answer(status, payload)

    def _exchange(self, data: bytes) -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout)
            sock.connect(str(self.socket_path))
            sock.sendall(data)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks)


def connection_error(path: Path, exc: OSError, timeout: float) -> CgdUnreachable:
    """Name the one thing the user must fix for each way an exchange can fail."""
    if isinstance(exc, FileNotFoundError):
        return CgdNotRunning(path)
    if isinstance(exc, ConnectionRefusedError):
        return CgdNotRunning(path, stale=True)
    if isinstance(exc, PermissionError):
        return CgdUnreachable(path, "permission denied: the system socket admits root and "
                                    "the group `computegroups`; ask to be added to it")
    if isinstance(exc, TimeoutError):
        return CgdUnreachable(path, f"no answer within {timeout:g}s: cgd is busy or stuck, see its log")
    return CgdUnreachable(path, exc.strerror or str(exc))
