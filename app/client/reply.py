"""A multi-turn session's reply text, gathered while its stream arrives (``ReplyText``).

The next turn of a session sends the reply as the server streamed it: the content text of
the stream's events (``app.client.sessions.reply_text``: decode the body, split the SSE
events, classify each). Doing all of that once the stream has ended puts ~0.3 ms of work
between the reply's last byte and the next turn's send. ``ReplyText`` does the same
decoding a read at a time instead, fed by the read callback (``StreamRequest(reply=...)``):
de-chunking, SSE splitting (``app.client.sse.split_events``) and ``Classifier`` exactly as
``RawStream.finalize`` and ``reply_text`` do them, so at the end only the last read's events
remain.

It only claims the common case, and says when it cannot (``result`` returns ``UNSURE``):
the caller then decodes the stream the exact way. It is sure when the stream is an HTTP 200
event stream (not a JSON answer), its status OK, every byte up to a ``data: [DONE]`` event
decoded with LF-only line ends, and no framing or event-size error met on the way. Then
the events before ``[DONE]`` are the ones ``finalize`` keeps, and the text is ``reply_text``'s;
their classification is handed to the record (``RawStream.ev_classified``), which then
classifies only the events after them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from app.client.events import Classified, Classifier
from app.client.http_request import is_json_type
from app.client.raw_stream import MODE_CHUNKED, MODE_HEAD, MODE_LENGTH, RawStream
from app.client.sse import event_data
from app.domain import TOKEN_KINDS, EventKind, RequestStatus


class _Unsure:
    def __repr__(self) -> str:
        return "UNSURE"


UNSURE: Final = _Unsure()


class ReplyText:
    """The content text of one stream, decoded a read at a time (``feed``)."""

    __slots__ = (
        "_chunk_left",
        "_chunked",
        "_classify",
        "_crlf",
        "_end",
        "_parts",
        "_pending",
        "_pos",
        "_stopped",
        "classified",
        "done",
        "failed",
        "on_end",
        "tokens",
        "unsure",
    )

    def __init__(self, on_end: Callable[[RawStream], None] | None = None) -> None:
        self.on_end = on_end  # called where the stream ended (OK), its last read decoded
        self.reset()

    def reset(self) -> None:
        """Start over (the request is sent again on a new connection)."""
        self._pos = -1  # next undecoded offset in the capture; -1 before the body
        self._chunked = False
        self._chunk_left = 0  # data bytes of the current chunk still to come
        self._crlf = False  # a chunk's data ended: its CRLF comes next
        self._end = False  # the terminal chunk was read
        self._pending = b""  # event-stream bytes not yet split into events
        self._parts: list[str] = []
        self._classify = Classifier().classify
        self.classified: list[Classified] = []  # each event before "[DONE]", as classified
        self._stopped = False  # nothing more to decode (done, failed or unsure)
        self.tokens = 0
        self.done = False  # a "[DONE]" event was decoded
        self.failed = False  # an event was an error (error object, non-JSON data)
        self.unsure = False  # something this fast path does not claim: decode the exact way

    def ended(self, raw: RawStream) -> None:
        if self.on_end is not None:
            self.on_end(raw)

    def _give_up(self) -> None:
        self.unsure = self._stopped = True

    def feed(self, raw: RawStream) -> None:
        """Decode what the capture (``raw.buf``) holds beyond what was decoded already."""
        if self._stopped:
            return
        pos = self._pos
        if pos < 0:
            if raw.mode == MODE_HEAD:
                return
            if raw.http_status != 200 or is_json_type(raw.content_type):
                self._give_up()
                return
            pos = raw.body_start
            self._chunked = raw.mode == MODE_CHUNKED
        buf = raw.buf
        if self._chunked:
            data = self._dechunk(buf, pos)
        else:
            end = min(len(buf), raw.body_end) if raw.mode == MODE_LENGTH else len(buf)
            data = bytes(buf[pos:end])
            self._pos = max(pos, end)
        if data and not self._stopped:
            self._events(data, raw.max_event_bytes)
            if len(self.classified) > raw.max_events:  # ``finalize`` fails such a stream
                self._give_up()

    def _dechunk(self, buf: bytearray, pos: int) -> bytes:
        """The chunk data in ``buf[pos:]``, by ``app.client.raw_stream.dechunk_steps``'s
        rules a piece at a time; a framing error gives up."""
        n = len(buf)
        out: list[bytearray] = []
        left = self._chunk_left
        if not left and not self._crlf and not self._end:
            # the usual read: whole chunks ("size CRLF data CRLF"), taken without the
            # general loop's state
            find = buf.find
            while True:
                i = find(b"\n", pos)
                if i < 0:
                    break
                line = buf[pos:i]
                if b";" in line:
                    break
                try:
                    size = int(line.strip(), 16)
                except ValueError:
                    break
                start = i + 1
                end = start + size
                if size <= 0 or end + 2 > n or buf[end] != 13 or buf[end + 1] != 10:
                    break
                out.append(buf[start:end])
                pos = end + 2
        while pos < n and not self._end:
            if left:
                take = left if left <= n - pos else n - pos
                out.append(buf[pos : pos + take])
                pos += take
                left -= take
                if left:
                    break
                self._crlf = True
            if self._crlf:
                if n - pos < 2:
                    break
                if buf[pos] != 13 or buf[pos + 1] != 10:
                    self._give_up()
                    break
                pos += 2
                self._crlf = False
            i = buf.find(b"\n", pos)
            if i < 0:
                if n - pos > 1024:
                    self._give_up()
                break
            line = buf[pos:i]
            if b";" in line:
                line = line.split(b";", 1)[0]
            try:
                size = int(line.strip(), 16)
            except ValueError:
                self._give_up()
                break
            if size < 0:
                self._give_up()
                break
            pos = i + 1
            if size == 0:
                self._end = True
            left = size
        self._pos = pos
        self._chunk_left = left
        return b"".join(out)

    def _events(self, data: bytes, max_event_bytes: int) -> None:
        """Split and classify the complete events (``app.client.sse.split_events``'s rules
        for LF-only streams); CR line ends give up (``finalize`` splits those by line)."""
        if b"\r" in data:
            self._give_up()
            return
        if self._pending:
            data = self._pending + data
        classify = self._classify
        find = data.find
        start = 0
        i = find(b"\n\n")
        while i >= 0:
            if i - start > max_event_bytes:
                self._give_up()
                return
            if i > start:
                if data.startswith(b"data: ", start) and find(b"\n", start, i) < 0:
                    ev: bytes | None = data[start + 6 : i]  # the usual one-line event
                else:
                    ev = event_data(data[start:i])
                if ev == b"[DONE]":
                    self.done = self._stopped = True
                    return
                c = classify(ev)
                self.classified.append(c)
                kind, text, _usage, error = c
                if error is not None:
                    self.failed = self._stopped = True
                    return
                if kind in TOKEN_KINDS:
                    self.tokens += 1
                    if kind is EventKind.CONTENT:
                        self._parts.append(text)
            start = i + 2
            i = find(b"\n\n", start)
        if len(data) - start > max_event_bytes:
            self._give_up()
            return
        self._pending = data[start:]

    def result(self, raw: RawStream) -> str | _Unsure | None:
        """The reply (``reply_text``'s answer: None for a failed turn) once ``raw`` ended,
        or ``UNSURE`` where only the exact decode can tell. When sure, the events decoded
        are the first ones ``finalize`` will give: their classification goes to
        ``raw.ev_classified`` so that the record does not classify them again."""
        if self.unsure or raw.status is not RequestStatus.OK:
            return UNSURE
        if self.failed:
            raw.ev_classified = self.classified
            return None
        if not self.done:
            return UNSURE
        raw.ev_classified = self.classified
        return "".join(self._parts) if self.tokens else None
