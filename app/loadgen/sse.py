"""Incremental Server-Sent Events parser: feed bytes as they arrive, get complete events.

Each event comes back as ``(data, nbytes)``: ``data`` is the event's ``data`` field (several
``data:`` lines joined by ``\\n``), or ``None`` for an event without data (a ``:`` comment
keep-alive, or only ``event:``/``id:``/``retry:`` fields); ``nbytes`` is the raw length of the
event on the wire, separator included. Lines may end in ``\\n``, ``\\r\\n`` or ``\\r``; an event
may be split anywhere across reads.

The hot path (LF-only streams, the common case) is a ``bytes.find`` per event. Streams using
``\\r`` take a line-by-line path. An incomplete event larger than ``max_event_bytes`` raises
``SSEEventTooLarge`` so a broken server cannot make the client buffer without bound.
"""

from __future__ import annotations

SSEEvent = tuple[bytes | None, int]

DEFAULT_MAX_EVENT_BYTES = 1 << 20


class SSEEventTooLarge(ValueError):
    """An event grew past the parser's cap before it was complete."""


def _data_of_lf(block: bytes) -> bytes | None:
    """The data field of one LF-separated event block (no trailing blank line)."""
    if block.startswith(b"data:") and b"\n" not in block:  # the usual single-line event
        return block[6:] if block[5:6] == b" " else block[5:]
    return _data_of_lines(block.split(b"\n"))


def _data_of_lines(lines: list[bytes]) -> bytes | None:
    parts: list[bytes] = []
    for line in lines:
        if line.startswith(b"data"):
            if line == b"data":
                parts.append(b"")
            elif line[4:5] == b":":
                parts.append(line[6:] if line[5:6] == b" " else line[5:])
        # comments (":..."), other fields and blank lines carry no data
    return b"\n".join(parts) if parts else None


class SSEParser:
    """Stateful, incremental SSE event splitter (one per stream)."""

    __slots__ = ("_buf", "_max")

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._buf = b""
        self._max = max_event_bytes

    @property
    def pending(self) -> bytes:
        """Bytes received that do not yet form a complete event."""
        return self._buf

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Add bytes; return the events they complete, in order."""
        old = self._buf
        buf = old + chunk if old else chunk
        if b"\r" in buf:
            return self._feed_lines(buf)
        out: list[SSEEvent] = []
        start = 0
        i = buf.find(b"\n\n", len(old) - 1 if old else 0)
        while i >= 0:
            if i - start > self._max:
                raise SSEEventTooLarge(f"SSE event larger than {self._max} bytes")
            block = buf[start:i]
            if block:
                out.append((_data_of_lf(block), i + 2 - start))
            start = i + 2
            i = buf.find(b"\n\n", start)
        # a lone separator "\n" between events is absorbed into the next block
        self._buf = buf[start:] if start < len(buf) else b""
        if len(self._buf) > self._max:
            raise SSEEventTooLarge(
                f"SSE event larger than {self._max} bytes without an event separator"
            )
        return out

    def _feed_lines(self, buf: bytes) -> list[SSEEvent]:
        """General path: lines ending in CR, LF or CRLF (re-scans the incomplete event)."""
        out: list[SSEEvent] = []
        n = len(buf)
        ev_start = 0
        pos = 0
        lines: list[bytes] = []
        while pos < n:
            lf = buf.find(b"\n", pos)
            cr = buf.find(b"\r", pos, lf if lf >= 0 else n)
            if cr >= 0:
                if cr == n - 1:
                    break  # a CR at the very end may be the first half of CRLF
                end, nxt = cr, (cr + 2 if buf[cr + 1] == 10 else cr + 1)
            elif lf >= 0:
                end, nxt = lf, lf + 1
            else:
                break
            line = buf[pos:end]
            pos = nxt
            if line:
                lines.append(line)
                if pos - ev_start > self._max:
                    raise SSEEventTooLarge(f"SSE event larger than {self._max} bytes")
            elif lines:
                out.append((_data_of_lines(lines), pos - ev_start))
                lines = []
                ev_start = pos
            else:
                pass  # blank line with no event: stays part of the next event's bytes
        self._buf = buf[ev_start:]
        if len(self._buf) > self._max:
            raise SSEEventTooLarge(
                f"SSE event larger than {self._max} bytes without an event separator"
            )
        return out

    def flush(self) -> list[SSEEvent]:
        """At end of stream: a trailing event that lacked its blank line, if any.

        Lenient on purpose (strict SSE discards it): a server that ends the body right after
        its last ``data:`` line still sent that line.
        """
        buf, self._buf = self._buf, b""
        lines = [ln for ln in buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")]
        lines = [ln for ln in lines if ln]
        if not lines:
            return []
        return [(_data_of_lines(lines), len(buf))]
