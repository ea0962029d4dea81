"""Server-Sent Events splitting of a received body (after the stream ended, in resumable
pieces: ``split_events``; a last event without its blank line: ``trailing_event``).

Each event comes back as ``(data, nbytes)``: ``data`` is the event's ``data`` field (several
``data:`` lines joined by ``\\n``), or ``None`` for an event without data (a ``:`` comment
keep-alive, or only ``event:``/``id:``/``retry:`` fields); ``nbytes`` is the raw length of the
event on the wire, separator included. Lines may end in ``\\n``, ``\\r\\n`` or ``\\r``.

The hot path (LF-only streams, the common case) is a ``bytes.find`` per event. Streams using
``\\r`` take a line-by-line path. An event larger than ``max_event_bytes`` is an error (the
events before it kept), so a broken server cannot make one event of the whole body. Both
paths split in resumable pieces of at most ``limit`` events, so the events of a huge body
never sit in one list.
"""

from __future__ import annotations

from app.client.limits import DEFAULT_MAX_EVENT_BYTES

SSEEvent = tuple[bytes | None, int]
SSEEventAt = tuple[bytes | None, int, int]  # (data, nbytes, end offset in the buffer)


def _data_of_lf(block: bytes) -> bytes | None:
    """The data field of one LF-separated event block (no trailing blank line)."""
    if block.startswith(b"data:") and b"\n" not in block:  # the usual single-line event
        return block[6:] if block[5:6] == b" " else block[5:]
    return _data_of_lines(block.split(b"\n"))


event_data = _data_of_lf  # the data field of one event block of an LF-only stream


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


def split_events(
    buf: bytes,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    scan_from: int = 0,
    *,
    start: int = 0,
    limit: int = 0,
    cr: bool | None = None,
) -> tuple[list[SSEEventAt], int, str | None]:
    """Split a whole buffer at once: ``(events, rest, error)``.

    Each event is ``(data, nbytes, end)`` with ``end`` the offset just past its blank line;
    ``rest`` is where the trailing incomplete event starts; ``error`` is set (and the events
    before it kept) when an event is larger than ``max_event_bytes``. ``scan_from`` lets an
    incremental caller skip separators it already searched for (LF-only buffers).

    ``limit`` > 0 returns after at most that many events, ``rest`` then being where the next
    call (``start=rest``) resumes: splitting in such pieces gives the same events as one call.
    ``cr`` says whether the buffer uses ``\r`` anywhere (line by line then); None: look
    (a resuming call must pass what the first one found).
    """
    if cr is None:
        cr = b"\r" in buf
    if cr:
        return _split_lines(buf, max_event_bytes, start, limit)
    out: list[SSEEventAt] = []
    find = buf.find
    append = out.append
    i = find(b"\n\n", max(scan_from, start))
    while i >= 0:
        if i - start > max_event_bytes:
            return out, start, f"SSE event larger than {max_event_bytes} bytes"
        if i > start:
            append((_data_of_lf(buf[start:i]), i + 2 - start, i + 2))
            if len(out) == limit:
                return out, i + 2, None
        start = i + 2
        i = find(b"\n\n", start)
    # a lone separator "\n" between events is absorbed into the next block
    if len(buf) - start > max_event_bytes:
        return out, start, _too_large_open(max_event_bytes)
    return out, start, None


def _too_large_open(max_event_bytes: int) -> str:
    return f"SSE event larger than {max_event_bytes} bytes without an event separator"


def _split_lines(
    buf: bytes, max_event_bytes: int, start: int = 0, limit: int = 0
) -> tuple[list[SSEEventAt], int, str | None]:
    """General path: lines ending in CR, LF or CRLF (from ``start``, at most ``limit``
    events when > 0)."""
    out: list[SSEEventAt] = []
    n = len(buf)
    ev_start = start
    pos = start
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
            if pos - ev_start > max_event_bytes:
                return out, ev_start, f"SSE event larger than {max_event_bytes} bytes"
        elif lines:
            out.append((_data_of_lines(lines), pos - ev_start, pos))
            lines = []
            ev_start = pos
            if len(out) == limit:
                return out, pos, None
        else:
            pass  # blank line with no event: stays part of the next event's bytes
    if n - ev_start > max_event_bytes:
        return out, ev_start, _too_large_open(max_event_bytes)
    return out, ev_start, None


def trailing_event(rest: bytes) -> SSEEvent | None:
    """At end of stream: a trailing event that lacked its blank line, if any.

    Lenient on purpose (strict SSE discards it): a server that ends the body right after
    its last ``data:`` line still sent that line.
    """
    lines = [ln for ln in rest.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n") if ln]
    if not lines:
        return None
    return (_data_of_lines(lines), len(rest))
