"""A stand-in for `CgdClient` that records requests and answers from a table.

The commands build their requests through the real click parsing and the real
`Endpoints` routes; only the socket exchange is replaced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from computegroups.daemon.client.endpoints import Endpoints
from computegroups.daemon.client.errors import CgdError
from computegroups.daemon.client.wire import Request

Answer = Any | CgdError | Callable[[Request], Any]


class FakeCgd(Endpoints[Any]):
    def __init__(self) -> None:
        self.timeout = 30.0
        """As `CgdClient`'s: commands that wait long (a release) raise it."""
        self.requests: list[Request] = []
        self.answers: dict[tuple[str, str], Answer] = {}

    def on(self, method: str, path: str, answer: Answer) -> None:
        """Answer requests whose path (query included) starts with `path`."""
        self.answers[(method, path)] = answer

    def send(self, request: Request) -> Any:
        self.requests.append(request)
        matches = [(p, a) for (m, p), a in self.answers.items() if m == request.method and request.path.startswith(p)]
        if not matches:
            raise CgdError(404, "not_found", f"no fake answer for {request.method} {request.path}")
        _, answer = max(matches, key=lambda pa: len(pa[0]))
        if isinstance(answer, CgdError):
            raise answer
        return answer(request) if callable(answer) else answer

    def sent(self, method: str | None = None) -> list[tuple[str, str, Any]]:
        return [(r.method, r.path, r.body) for r in self.requests if method is None or r.method == method]


def install(monkeypatch: pytest.MonkeyPatch) -> FakeCgd:
    fake = FakeCgd()
    monkeypatch.setattr("computegroups.cli.connect.CgdClient", lambda *args, **kwargs: fake)
    return fake
