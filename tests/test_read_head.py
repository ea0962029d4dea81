"""``read_head``: a response's final head read from a capture, by hand-written bytes."""

from __future__ import annotations

from app.client.http_response import MAX_HEAD_BYTES, Head, read_head
from app.client.raw_stream import MODE_CHUNKED, MODE_CLOSE, MODE_LENGTH


def test_content_length_head() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\n"
    h = read_head(bytearray(head + b"hello"), 0)
    assert h == Head(200, len(head), "application/json", True, False, MODE_LENGTH, len(head) + 5)


def test_interim_heads_are_skipped_and_an_incomplete_head_resumes_past_them() -> None:
    interim = b"HTTP/1.1 100 Continue\r\n\r\n"
    buf = bytearray(interim + b"HTTP/1.1 200 OK\r\ntransfer-enc")
    assert read_head(buf, 0) == len(interim)  # look from here next time
    buf += b"oding: chunked\r\ncontent-type: text/event-stream\r\n\r\n"
    h = read_head(buf, len(interim))
    assert isinstance(h, Head)
    assert (h.status, h.mode, h.body_end, h.json) == (200, MODE_CHUNKED, -1, False)
    assert h.body_start == len(buf)


def test_framing_and_close() -> None:
    h = read_head(bytearray(b"HTTP/1.0 200 OK\n\n"), 0)  # bare LF, HTTP/1.0: read to close
    assert isinstance(h, Head) and (h.mode, h.server_close, h.body_start) == (MODE_CLOSE, True, 17)
    h = read_head(bytearray(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n"), 0)
    assert isinstance(h, Head) and not h.server_close
    h = read_head(bytearray(b"HTTP/1.1 204 No Content\r\nConnection: Close\r\n\r\n"), 0)
    assert isinstance(h, Head) and (h.mode, h.body_end, h.server_close) == (MODE_LENGTH, 46, True)
    h = read_head(bytearray(b"HTTP/1.1 500 x\r\nContent-Type: application/json\r\n\r\n"), 0)
    assert isinstance(h, Head) and (h.status, h.json, h.mode) == (500, True, MODE_CLOSE)


def test_protocol_errors_are_named_without_quoting_the_target() -> None:
    assert read_head(bytearray(b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n"), 0) == (
        "bad Content-Length (not shown)"
    )
    assert read_head(bytearray(b"HTTP/1.1 200 OK\r\nContent-Length: x1\r\n\r\n"), 0) == (
        "bad Content-Length (not shown)"
    )
    err = read_head(bytearray(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"), 0)
    assert isinstance(err, str) and "not HTTP/1.x" in err and "OpenSSH" not in err
    assert read_head(bytearray(b"HTTP/1.1 200 OK\r\n" + b"x" * (MAX_HEAD_BYTES + 1)), 0) == (
        "head too large"
    )
    assert read_head(bytearray(b"HTTP/1.1 200 OK\r\nX: y"), 0) == 0  # not complete yet
