"""A one-answer-per-connection server on a Unix socket, for transport tests.

It answers with canned bytes so the tests can send what cgd never would
(chunked bodies, crash pages, silence) and see what the client makes of it.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path


class FakeSocket:
    def __init__(self, path: Path, answer: bytes, silent: bool = False) -> None:
        self.path = path
        self.answer = answer
        self.silent = silent
        self.requests: list[bytes] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(8)
        self._server.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> FakeSocket:  # typing.Self is not in Python 3.10
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._server.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            with conn:
                self.requests.append(_read_request(conn))
                if self.silent:
                    self._stop.wait(5)
                    continue
                conn.sendall(self.answer)


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


def http_answer(status: int, body: bytes, reason: str = "OK") -> bytes:
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body
