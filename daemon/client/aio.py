"""The async client under `ComputeGroupManager`.

asyncio streams rather than tornado: a scheduler embedding the manager may run
any asyncio loop, and tornado (cgd's server) would be a heavy import for a
client that sends one small request per call. The framing is `wire`'s, the
same as the blocking client's. Cancelling the awaiting task cancels the
exchange; nothing is left running on a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from computegroups.daemon.client.endpoints import Endpoints, events_request
from computegroups.daemon.client.errors import CgdUnreachable
from computegroups.daemon.client.locate import client_socket_path
from computegroups.daemon.client.resume import Note, Resume
from computegroups.daemon.client.sync import DEFAULT_TIMEOUT_S, connection_error
from computegroups.daemon.client.wire import (
    BrokenAnswer,
    Request,
    StreamLines,
    decode_answer,
    parse_answer,
    parse_head,
)


class AsyncCgdClient(Endpoints[Awaitable[Any]]):
    """The routes of `Endpoints`, each an awaitable of the decoded answer."""

    def __init__(self, socket_path: str | os.PathLike[str] | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.socket_path = client_socket_path(socket_path)
        self.timeout = timeout

    def send(self, request: Request) -> Awaitable[Any]:
        return self._send(request)

    async def _send(self, request: Request) -> Any:
        try:
            raw = await asyncio.wait_for(self._exchange(request.encode()), self.timeout)
            status, payload = parse_answer(raw)
        except asyncio.TimeoutError:  # not the builtin (nor an OSError) before Python 3.11
            raise connection_error(self.socket_path, TimeoutError(), self.timeout) from None
        except OSError as exc:
            raise connection_error(self.socket_path, exc, self.timeout) from None
        except BrokenAnswer as exc:
            raise CgdUnreachable(self.socket_path, f"broken answer: {exc}") from None
        return decode_answer(status, payload, self.socket_path)

    async def events(self, since: int | None = None, follow: bool = True, on_lost: Note | None = None
                     ) -> AsyncIterator[Any]:
        """`CgdClient.events`, as an async iterator: each event as cgd streams it, and following
        on across a restart of cgd from the last event it gave (`Resume`)."""
        if not follow:
            async with contextlib.aclosing(self._events(since, follow, lambda: None)) as stream:
                async for event in stream:
                    yield event
            return
        resume = Resume(since, on_lost)
        while True:
            try:
                async with contextlib.aclosing(self._events(resume.since, follow, resume.opened)) as stream:
                    async for event in stream:
                        resume.seen(event)
                        yield event
                lost = None
            except CgdUnreachable as exc:
                lost = exc
            await asyncio.sleep(resume.retry(lost))

    async def _events(self, since: int | None, follow: bool, opened: Callable[[], None]
                      ) -> AsyncGenerator[Any, None]:
        """One `GET /v1/events` stream, until it ends; `opened` once cgd has answered with it."""
        request = events_request(since, follow)
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(str(self.socket_path)), self.timeout)
        except asyncio.TimeoutError:
            raise connection_error(self.socket_path, TimeoutError(), self.timeout) from None
        except OSError as exc:
            raise connection_error(self.socket_path, exc, self.timeout) from None
        try:
            writer.write(request.encode())
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.timeout)
            status, headers = parse_head(head[:-4])
            if status >= 400:  # a refusal is one JSON answer: read it whole, raise it
                decode_answer(*parse_answer(head + await reader.read()), self.socket_path)
            lines = StreamLines("chunked" in headers.get("transfer-encoding", "").lower())
            opened()
            while not lines.ended:
                data = await (reader.read(65536) if follow else asyncio.wait_for(reader.read(65536), self.timeout))
                if not data:
                    lines.finish()
                    return
                for line in lines.feed(data):
                    yield json.loads(line)
        except asyncio.TimeoutError:
            raise connection_error(self.socket_path, TimeoutError(), self.timeout) from None
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise CgdUnreachable(self.socket_path, f"broken answer: {exc}") from None
        except OSError as exc:
            raise connection_error(self.socket_path, exc, self.timeout) from None
        except (BrokenAnswer, ValueError) as exc:
            raise CgdUnreachable(self.socket_path, f"broken answer: {exc}") from None
        finally:
            await _close(writer)

    async def _exchange(self, data: bytes) -> bytes:
        reader, writer = await asyncio.open_unix_connection(str(self.socket_path))
        try:
            writer.write(data)
            await writer.drain()
            return await reader.read()
        finally:
            await _close(writer)


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close a connection to cgd; one cgd already dropped is closed all the same."""
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
