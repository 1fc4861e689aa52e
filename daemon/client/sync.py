"""The blocking client `cgctl` uses: one short exchange per call on the socket.

No event loop and nothing beyond `socket` and `json`, because cgctl starts
once per command and its start-up time is what a user feels.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from computegroups.daemon.client.endpoints import Endpoints, events_request
from computegroups.daemon.client.errors import CgdNotRunning, CgdUnreachable
from computegroups.daemon.client.locate import client_socket_path
from computegroups.daemon.client.resume import Note, Resume
from computegroups.daemon.client.wire import (
    BrokenAnswer,
    Request,
    StreamLines,
    decode_answer,
    parse_answer,
    parse_head,
)

DEFAULT_TIMEOUT_S = 60.0
Json = Any


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
        return decode_answer(status, payload, self.socket_path)

    def events(self, since: int | None = None, follow: bool = True, on_lost: Note | None = None
               ) -> Iterator[Json]:
        """The events after `since` (all kept ones without it) the caller may see, then, with
        `follow`, each new one as it happens: the iterator blocks for the next. Following, it
        outlives cgd: when the stream ends or breaks it connects again (`on_lost` hears one
        line per outage) and reads on after the last event it gave, a `gap` event first when
        cgd did not keep them all; only a cgd that never answered raises CgdNotRunning."""
        if not follow:
            yield from self._events(since, follow, lambda: None)
            return
        resume = Resume(since, on_lost)
        while True:
            try:
                for event in self._events(resume.since, follow, resume.opened):
                    resume.seen(event)
                    yield event
                lost = None
            except CgdUnreachable as exc:
                lost = exc
            time.sleep(resume.retry(lost))

    def _events(self, since: int | None, follow: bool, opened: Callable[[], None]) -> Iterator[Json]:
        """One `GET /v1/events` stream, until it ends; `opened` once cgd has answered with it."""
        request = events_request(since, follow)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout)
                sock.connect(str(self.socket_path))
                sock.sendall(request.encode())
                raw = b""
                while b"\r\n\r\n" not in raw:
                    chunk = sock.recv(65536)
                    if not chunk:
                        raise BrokenAnswer("the answer ended before its headers did")
                    raw += chunk
                head, _, rest = raw.partition(b"\r\n\r\n")
                status, headers = parse_head(head)
                if status >= 400:  # a refusal is one JSON answer: read it whole, raise it
                    while chunk := sock.recv(65536):
                        rest += chunk
                    decode_answer(*parse_answer(head + b"\r\n\r\n" + rest), self.socket_path)
                lines = StreamLines("chunked" in headers.get("transfer-encoding", "").lower())
                opened()
                sock.settimeout(None if follow else self.timeout)
                data = rest
                while True:
                    for line in lines.feed(data):
                        yield json.loads(line)
                    if lines.ended:
                        return
                    data = sock.recv(65536)
                    if not data:
                        lines.finish()
                        return
        except OSError as exc:
            raise connection_error(self.socket_path, exc, self.timeout) from None
        except (BrokenAnswer, ValueError) as exc:
            raise CgdUnreachable(self.socket_path, f"broken answer: {exc}") from None

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
