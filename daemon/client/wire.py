"""HTTP/1.1 framing for cgd's socket, shared by the blocking and async clients.

Hand-written rather than `http.client`: that module pulls in `ssl` and the
`email` parser, about 16 ms of every `cgctl` start, for features a local
socket never needs. One request per connection with `Connection: close`
keeps the framing small: the answer ends where the stream ends, and only
Content-Length and chunked bodies (what tornado sends) need decoding.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from computegroups.daemon.client.errors import CgdError, CgdStopping

Json = Any


class BrokenAnswer(ValueError):
    """The bytes cgd sent are not an HTTP answer (it died mid-answer)."""


class Request(NamedTuple):
    method: str
    path: str
    body: Json = None

    def encode(self) -> bytes:
        head = [f"{self.method} {self.path} HTTP/1.1", "Host: cgd",
                "Accept: application/json", "Connection: close"]
        data = b""
        if self.body is not None:
            data = json.dumps(self.body).encode()
            head.append("Content-Type: application/json")
        if self.body is not None or self.method in ("POST", "PUT", "PATCH"):
            head.append(f"Content-Length: {len(data)}")
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + data


def parse_answer(raw: bytes) -> tuple[int, bytes]:
    """Status and body of one complete answer, read up to the end of stream."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        raise BrokenAnswer("the answer ended before its headers did" if raw else "no answer")
    status, headers = parse_head(head)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return status, _dechunk(rest)
    if "content-length" in headers:
        length = int(headers["content-length"])
        if len(rest) < length:
            raise BrokenAnswer(f"body cut short: {len(rest)} of {length} bytes")
        return status, rest[:length]
    return status, rest


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    pos = 0
    while True:
        end = data.find(b"\r\n", pos)
        if end < 0:
            raise BrokenAnswer("chunked body cut short")
        size = int(data[pos:end].split(b";", 1)[0], 16)
        if size == 0:
            return bytes(out)
        start = end + 2
        if len(data) < start + size:
            raise BrokenAnswer("chunked body cut short")
        out += data[start:start + size]
        pos = start + size + 2


def decode_answer(status: int, payload: bytes, socket_path: Path) -> Json:
    """The answer's JSON, or the daemon's refusal as a `CgdError`.

    A body that is not cgd's error shape (a crash page) still becomes a
    `CgdError`, so callers need only one except clause. A cgd that is
    stopping (503 `stopping`) is `CgdStopping`, which callers that outlast a
    restart take as they take a refused connection.
    """
    try:
        doc = json.loads(payload) if payload else None
    except ValueError:
        if status < 400:
            raise CgdError(status, "bad_response", f"cgd answered {status} with a body that is not JSON") from None
        doc = None
    if status < 400:
        return doc
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        if status == 503 and error.get("code") == "stopping":
            raise CgdStopping(socket_path, error["message"])
        raise CgdError(status, str(error.get("code", "unknown")), error["message"])
    text = payload.decode(errors="replace").strip().splitlines()
    raise CgdError(status, "bad_response", f"cgd answered {status}: {text[0][:200] if text else 'no body'}")


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """Status and headers (names lower-cased) of an answer's head, without its blank line."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise BrokenAnswer(f"not an HTTP status line: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


class StreamLines:
    """The lines of a streamed answer's body, as its bytes arrive (`GET /v1/events`).

    Feed it what the socket gives: it undoes chunked transfer encoding when
    the head says so, and hands back each complete line; `ended` is true
    once the last chunk came.
    """

    def __init__(self, chunked: bool) -> None:
        self._chunked = chunked
        self._raw = bytearray()
        self._body = bytearray()
        self.ended = False

    def feed(self, data: bytes) -> list[bytes]:
        if not self._chunked:
            self._body += data
        else:
            self._raw += data
            self._dechunk()
        *lines, rest = self._body.split(b"\n")
        self._body = bytearray(rest)
        return [bytes(line) for line in lines if line.strip()]

    def finish(self) -> None:
        """The connection has ended: a chunked body whose last chunk never came broke off (cgd
        was killed mid-stream), which a reader must not take for the stream's end."""
        if self._chunked and not self.ended:
            raise BrokenAnswer("the stream broke off before its end")

    def _dechunk(self) -> None:
        while not self.ended:
            end = self._raw.find(b"\r\n")
            if end < 0:
                return
            try:
                size = int(bytes(self._raw[:end]).split(b";", 1)[0], 16)
            except ValueError:
                raise BrokenAnswer("not a chunk size line") from None
            if size == 0:
                self.ended = True
                return
            if len(self._raw) < end + 2 + size + 2:
                return
            self._body += self._raw[end + 2:end + 2 + size]
            del self._raw[:end + 2 + size + 2]
