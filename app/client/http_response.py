"""A response's head and end markers, read by the read callback (``app.client.http_stream``):
``read_head`` (the final head of a capture: status, framing, whether the server closes),
``parse_head`` (status and headers of one head), ``done_at`` (a complete ``data: [DONE]``
event at the capture's tail), ``LAST_CHUNK`` (a chunked body's terminal chunk).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.client.http_request import is_json_type
from app.client.raw_stream import MODE_CHUNKED, MODE_CLOSE, MODE_LENGTH

LAST_CHUNK = b"\r\n0\r\n\r\n"
HEAD_END = re.compile(rb"\r?\n\r?\n")
MAX_HEAD_BYTES = 64 * 1024


def done_at(buf: bytearray, j: int, body_start: int) -> int:
    """If ``buf[j:]`` starts a complete ``[DONE]`` line ending an event, the offset just past
    that event's blank line, else -1. ``j`` points at ``[DONE]``."""
    if buf[j - 6 : j] == b"data: ":
        k = j - 6
    elif buf[j - 5 : j] == b"data:":
        k = j - 5
    else:
        return -1
    if k > body_start and buf[k - 1] not in (10, 13):
        return -1  # not at the start of a line
    e = j + 6
    tail = bytes(buf[e : e + 4])
    if tail.startswith(b"\n\n") or tail.startswith(b"\r\r"):
        return e + 2
    if tail == b"\r\n\r\n":
        return e + 4
    return -1


def parse_head(head: bytes) -> tuple[int, dict[bytes, bytes]]:
    """Status code and (lower-cased) headers of one response head; ValueError if malformed."""
    lines = head.split(b"\n")
    status_line = lines[0].rstrip(b"\r")
    parts = status_line.split(b" ", 2)
    # what a target sent is not quoted: a run must not read another service's banners
    bad = f"bad status line ({len(status_line):,} bytes, not HTTP/1.x; not shown)"
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3:
        raise ValueError(bad)
    try:
        status = int(parts[1])
    except ValueError:
        raise ValueError(bad) from None
    headers: dict[bytes, bytes] = {}
    for ln in lines[1:]:
        ln = ln.rstrip(b"\r")
        if not ln:
            continue
        name, sep, value = ln.partition(b":")
        if not sep or not name or name != name.strip():
            raise ValueError(f"bad header line ({len(ln):,} bytes; not shown)")
        key = name.lower()
        v = value.strip()
        if key in headers and key in (b"transfer-encoding",):
            headers[key] = headers[key] + b"," + v
        elif key == b"content-length" and key in headers and headers[key] != v:
            raise ValueError("conflicting Content-Length headers")
        else:
            headers[key] = v
    return status, headers


@dataclass(frozen=True, slots=True)
class Head:
    """A response's final head (after any 1xx heads)."""

    status: int
    body_start: int  # the offset just past the head
    content_type: str | None
    json: bool  # a JSON answer (one event)
    server_close: bool  # the server closes the connection after this response
    mode: int  # MODE_LENGTH, MODE_CHUNKED or MODE_CLOSE (read until the server closes)
    body_end: int  # MODE_LENGTH: the offset just past the body; else -1


def read_head(buf: bytearray, pos: int) -> Head | int | str:
    """The final response head in ``buf`` from ``pos`` on: a ``Head``; or, while it is not
    complete, the offset to look from next time (past the 1xx heads already read); or a
    protocol error's text."""
    while True:
        m = HEAD_END.search(buf, pos)
        if m is None:
            return "head too large" if len(buf) - pos > MAX_HEAD_BYTES else pos
        try:
            status, headers = parse_head(bytes(buf[pos : m.start()]))
        except ValueError as e:
            return str(e)
        head_pos = pos
        pos = m.end()
        if 100 <= status < 200:
            continue
        ctype_raw = headers.get(b"content-type")
        ctype = ctype_raw.decode("latin-1") if ctype_raw is not None else None
        conn_hdr = headers.get(b"connection", b"").lower()
        http10 = bytes(buf[head_pos : head_pos + 8]) == b"HTTP/1.0"
        close = b"close" in conn_hdr or (http10 and b"keep-alive" not in conn_hdr)
        te = headers.get(b"transfer-encoding", b"").lower()
        cl = headers.get(b"content-length")
        mode, body_end = MODE_CLOSE, -1
        if status in (204, 304):
            mode, body_end = MODE_LENGTH, pos
        elif b"chunked" in te:
            mode = MODE_CHUNKED
        elif cl is not None:
            try:
                length = int(cl)
            except ValueError:
                length = -1
            if length < 0:
                return "bad Content-Length (not shown)"
            mode, body_end = MODE_LENGTH, pos + length
        return Head(status, pos, ctype, is_json_type(ctype), close, mode, body_end)
