"""HTTP framing and error decoding, shared by both clients."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from computegroups.daemon.client.errors import CgdError, CgdStopping, CgdUnreachable
from computegroups.daemon.client.wire import BrokenAnswer, Request, StreamLines, decode_answer, parse_answer

SOCK = Path("/run/cgd.sock")


def test_request_with_body_sends_json_and_its_length() -> None:
    raw = Request("POST", "/v1/components", {"name": "web"}).encode()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/components HTTP/1.1\r\n")
    assert b"Content-Type: application/json" in head
    assert f"Content-Length: {len(body)}".encode() in head
    assert b"Connection: close" in head
    assert json.loads(body) == {"name": "web"}


def test_post_without_body_still_says_length_zero() -> None:
    head = Request("POST", "/v1/gpus/1/drain").encode()
    assert head.endswith(b"Content-Length: 0\r\n\r\n")


def test_get_has_no_body_headers() -> None:
    raw = Request("GET", "/v1/status").encode()
    assert b"Content-Length" not in raw and raw.endswith(b"\r\n\r\n")


def test_content_length_bounds_the_body() -> None:
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}trailing"
    assert parse_answer(raw) == (200, b"{}")


def test_chunked_body_is_joined() -> None:
    raw = (b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"4\r\n{\"a\"\r\n3;ext=1\r\n: 1\r\n1\r\n}\r\n0\r\n\r\n")
    assert parse_answer(raw) == (201, b'{"a": 1}')


def test_body_to_end_of_stream_without_length() -> None:
    assert parse_answer(b"HTTP/1.1 200 OK\r\n\r\n[1]") == (200, b"[1]")


@pytest.mark.parametrize("raw, words", [
    (b"", "no answer"),
    (b"HTTP/1.1 200 OK\r\nContent-Len", "before its headers"),
    (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP status line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}", "cut short"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nA\r\n{}", "cut short"),
])
def test_broken_answers_are_named(raw: bytes, words: str) -> None:
    with pytest.raises(BrokenAnswer, match=words):
        parse_answer(raw)


def test_success_decodes_json() -> None:
    assert decode_answer(200, b'{"gpus": []}', SOCK) == {"gpus": []}


def test_daemon_error_keeps_status_code_and_message() -> None:
    body = json.dumps({"error": {"code": "insufficient_capacity", "message": "GPU 0 is full"}}).encode()
    with pytest.raises(CgdError) as caught:
        decode_answer(409, body, SOCK)
    error = caught.value
    assert (error.status, error.code, error.message) == (409, "insufficient_capacity", "GPU 0 is full")


def test_a_stopping_cgd_is_unreachable_for_now_not_a_refusal() -> None:
    """What a long poll cut short by a restart gets: callers that wait out a restart catch it."""
    body = json.dumps({"error": {"code": "stopping", "message": "cgd is stopping"}}).encode()
    with pytest.raises(CgdStopping, match="cgd is stopping") as caught:
        decode_answer(503, body, SOCK)
    assert issubclass(CgdStopping, CgdUnreachable) and caught.value.socket_path == SOCK
    with pytest.raises(CgdError):  # another 503 is still a refusal
        decode_answer(503, json.dumps({"error": {"code": "unavailable", "message": "locked"}}).encode(), SOCK)


def test_error_that_is_not_cgds_shape_still_is_a_cgd_error() -> None:
    with pytest.raises(CgdError, match="cgd answered 502: Bad Gateway") as caught:
        decode_answer(502, b"Bad Gateway\nmore", SOCK)
    assert caught.value.code == "bad_response"


def test_success_that_is_not_json_is_refused() -> None:
    with pytest.raises(CgdError, match="not JSON"):
        decode_answer(200, b"<html>", SOCK)


def test_stream_lines_come_whole_however_the_chunks_are_cut() -> None:
    body = b'{"seq": 1}\n{"seq": 2}\n'
    chunked = b"".join(f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in (body[:7], body[7:])) + b"0\r\n\r\n"
    lines = StreamLines(chunked=True)
    got = [line for i in range(len(chunked)) for line in lines.feed(chunked[i:i + 1])]
    assert got == [b'{"seq": 1}', b'{"seq": 2}'] and lines.ended
    plain = StreamLines(chunked=False)
    assert plain.feed(b'{"a"') == [] and plain.feed(b': 1}\n\n{"b"') == [b'{"a": 1}']


def test_a_bad_chunk_size_is_a_broken_answer() -> None:
    with pytest.raises(BrokenAnswer):
        StreamLines(chunked=True).feed(b"zz\r\n")



def test_a_chunked_stream_cut_before_its_last_chunk_broke_off() -> None:
    whole = StreamLines(chunked=True)
    whole.feed(b"b\r\n{\"seq\": 1}\n\r\n0\r\n\r\n")
    whole.finish()  # ended as it should: nothing to say
    cut = StreamLines(chunked=True)
    assert cut.feed(b"b\r\n{\"seq\": 1}\n\r\n") == [b'{"seq": 1}']
    with pytest.raises(BrokenAnswer, match="broke off"):
        cut.finish()  # cgd killed mid-stream
    StreamLines(chunked=False).finish()  # a plain body ends where the connection does
