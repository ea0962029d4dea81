"""One response as the client captured it (``RawStream``), and its decoding after the stream.

The read callback (``app.client.http_stream``) only fills the capture: the raw bytes, and per
read its stamp, user-space stamp and end offset. ``RawStream.finalize()`` (run by
``StreamRequest.run()``, or by the runner between I/O rounds, in resumable pieces) decodes the
body (``dechunk_steps``), splits the SSE events (``app.client.sse``; ``max_event_bytes`` and
``max_response_events`` checked there) and maps each event's last byte back to the read that
delivered it: an event gets that read's stamp. The capture's bytes leave the run's
``BufferBudget`` when decoding starts; the raw bytes are dropped once the body is decoded.

A stream whose end someone waits on to send the next request (a session's or an agent's
reply: ``decode_while_arriving``) is decoded ahead: after each read, ``advance`` does the
same decoding for what that read completed (``Eager``), so ``finalize`` is left its tail.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field

from app.client.events import Classified, http_error_text
from app.client.http_request import is_json_type
from app.client.limits import (
    CUT_EVENTS_KEPT,
    DEFAULT_MAX_EVENT_BYTES,
    DEFAULT_MAX_RESPONSE_EVENTS,
    ERROR_BODY_BYTES,
    BufferBudget,
)
from app.client.sse import split_events, trailing_event
from app.domain import ClockSource, RequestStatus

MODE_HEAD = 0  # still reading the response head
MODE_CHUNKED = 1
MODE_LENGTH = 2  # Content-Length (or an empty body: 204/304, HEAD)
MODE_CLOSE = 3  # read until the server closes
FINALIZE_STEP_EVENTS = 64  # events stamped per resumable piece of RawStream.finalize_steps
SMALL_BODY_BYTES = 16 << 10  # a body this small is decoded and split in one piece
_DONE = b"[DONE]"

# How the capture ended (RawStream.end_kind), decided in the read callback; ``finalize``
# turns it into status and error once the body has been decoded.
END_NONE = 0  # cut off: timeout, abort, read error (status and error already final)
END_BODY = 1  # the body ended normally (terminal chunk, byte count, or close)
END_DONE = 2  # a "data: [DONE]" event ended the stream
END_EOF = 3  # the server closed the connection before the body ended
END_CAP = 4  # the response outgrew a client limit (``RawStream.cap_reason`` says which)


def chunk_size(line: bytes | bytearray) -> int | str:
    """A chunk's size from its size line (without the LF), or what is wrong with it."""
    try:
        size = int(line, 16)  # int() strips the spaces and the CR itself
    except ValueError:
        try:  # a chunk extension: "size;name=value"
            size = int(line.split(b";", 1)[0], 16)
        except ValueError:
            return f"chunked body: bad chunk size line ({len(line):,} bytes; not shown)"
    return size if size >= 0 else "chunked body: negative chunk size"


def dechunk_steps(
    buf: bytearray, start: int, read_end: Sequence[int] = (), step_chunks: int = 64
) -> Generator[None, None, tuple[bytes, array[int], bool, str | None]]:
    """Decode a chunked body from ``buf[start:]``, in resumable pieces: yields every
    ``step_chunks`` chunks. The chunks' data is moved down over the framing, in place: ``buf``
    is consumed (nothing else may use it meanwhile), so decoding needs no memory beyond the
    payload's one copy and one int per read.

    Returns ``(payload, avail, done, error)``: the payload bytes; for each read of
    ``read_end`` (its end offset in ``buf``) how many payload bytes had arrived by its end
    (to map a payload offset back to the read that delivered it); whether the terminal
    chunk was reached; a framing error, if any (the payload before it is kept). An
    incomplete last chunk is not an error.
    """
    mv = memoryview(buf)
    n = len(buf)
    pos = start
    w = start  # where the next chunk's data goes
    avail = array("q")
    nreads = len(read_end)
    k = 0  # the next read whose ``avail`` is not known yet
    chunks = 0
    find = buf.find
    error: str | None = None
    done = False
    try:
        while pos < n:
            chunks += 1
            if chunks % step_chunks == 0:
                yield
            i = find(b"\n", pos)
            if i < 0:
                if n - pos > 1024:
                    error = "chunked body: chunk-size line too long"
                break
            size = chunk_size(buf[pos:i])
            if isinstance(size, str):
                error = size
                break
            pos = i + 1
            if size == 0:
                done = True
                break
            end = pos + size
            cut = end > n  # cut off inside this chunk's data: what came
            if cut:
                end = n
            plen = w - start
            while k < nreads:  # the reads that ended before this chunk's data did
                e = read_end[k]
                if e > end:
                    break
                avail.append(plen + e - pos if e > pos else plen)
                k += 1
            mv[w : w + end - pos] = mv[pos:end]  # a memmove (the ranges may overlap)
            w += end - pos
            if cut or n - end < 2:
                break
            if buf[end] != 13 or buf[end + 1] != 10:
                error = "chunked body: missing CRLF after chunk data"
                break
            pos = end + 2
        payload = bytes(mv[start:w])
    finally:
        mv.release()
    while k < nreads:
        avail.append(w - start)
        k += 1
    return payload, avail, done, error


@dataclass(slots=True)
class Eager:
    """A stream decoded while it arrives (``RawStream.advance``): a session's or agent's
    reply, whose end must be turned into the next request at once. The decoding is the one
    ``finalize`` does, in the same order, done ahead: each read's complete chunks are
    copied out of the capture (which stays as it came: the read callback's end checks look
    at it) and their complete events split, stamped and classified. ``finalize`` goes on
    from where it stopped; only the tail is left for the moment the stream ends.

    It stops (``frozen``) at anything irregular (a framing error, an event past
    ``max_event_bytes``, ``[DONE]``, the events ``CUT_EVENTS_KEPT`` keeps): ``finalize``
    then meets it itself, as it would have without this. A payload with a CR splits line
    by line from its start (``resplit``): the events are split again at the end."""

    classify: Callable[[bytes | None], Classified]
    raw_pos: int = -1  # the next chunk's size line in the capture (-1: body not reached)
    pay: bytearray = field(default_factory=bytearray)  # the payload decoded so far
    marks: array[int] = field(default_factory=lambda: array("q"))  # per read: payload by then
    split: int = 0  # where the next event starts in ``pay``
    k: int = 0  # the read whose stamp the last event got
    frozen: bool = False
    resplit: bool = False


@dataclass(slots=True)
class RawStream:
    """What one request observed, before classification. Times: absolute monotonic ns.

    The read callback only fills the capture (``buf``: the raw response bytes; per read its
    stamp, user-space stamp and end offset in ``buf``); ``finalize()`` decodes the body,
    splits the SSE events and fills ``ev_*``, each event stamped by the read in which its
    last byte arrived. ``StreamRequest.run()`` finalizes unless told not to.
    """

    request_id: str
    t0_ns: int = 0
    end_ns: int = 0
    done_ns: int | None = None
    status: RequestStatus = RequestStatus.OK
    error: str | None = None
    http_status: int | None = None
    clock: ClockSource = ClockSource.USERSPACE
    ev_t: list[int] = field(default_factory=list)  # stamp per SSE event (kernel or user)
    ev_user_t: list[int] = field(default_factory=list)  # user-space stamp of the same read
    ev_bytes: list[int] = field(default_factory=list)
    ev_data: list[bytes | None] = field(default_factory=list)
    kernel_reads: int = 0
    user_reads: int = 0
    body_bytes: int = 0
    # ---- capture (filled by the read callback, consumed by finalize)
    buf: bytearray = field(default_factory=bytearray, repr=False)
    read_t: list[int] = field(default_factory=list, repr=False)
    read_user_t: list[int] = field(default_factory=list, repr=False)
    read_end: list[int] = field(default_factory=list, repr=False)
    body_start: int = -1  # offset of the body in buf, once the head is parsed
    body_end: int = -1  # Content-Length bodies: where the body ends in buf
    mode: int = MODE_HEAD
    end_kind: int = END_NONE
    end_stamp: int = 0
    count_events: bool = False  # append "(N events received)" to the error on finalize
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES
    max_events: int = DEFAULT_MAX_RESPONSE_EVENTS
    cap_reason: str | None = None  # END_CAP: the limit the response went past
    budget: BufferBudget | None = field(default=None, repr=False)  # the capture is counted in
    finalized: bool = False
    # ---- phases (SPEC 1b), absolute monotonic ns; 0 where the phase did not happen
    io_start_ns: int = 0  # the request's I/O began (a connection taken or being opened)
    connect_start_ns: int = 0
    connect_end_ns: int = 0
    tls_end_ns: int = 0
    sent_end_ns: int = 0  # the request's last byte left (transmit stamp or after the send)
    head_ns: int = 0  # stamp of the read that completed the response head
    send_clock: ClockSource = ClockSource.USERSPACE  # where t0 came from
    sent_any: bool = False  # some of the request's bytes reached the kernel
    conn_id: int = 0
    conn_reused: bool = False
    retries: int = 0
    keep_alive: bool = False  # the connection stayed open for the next request
    # a body that had not ended DONE_GRACE_S after "[DONE]": when its connection was closed
    closed_unended_ns: int = 0
    read_to_close: bool = False  # the response was framed by the server closing
    server_close: bool = False  # the response said "Connection: close" (or HTTP/1.0)
    content_type: str | None = None
    # the events' classification, already done where the stream ended (a session's reply,
    # ``app.client.sessions.reply_text``): the record uses it for those events
    ev_classified: list[Classified] | None = field(default=None, repr=False)
    eager: Eager | None = field(default=None, repr=False)  # decoded while it arrives

    @property
    def wire_end_ns(self) -> int:
        """When the response was over on the wire: where it ended (``end_ns``: its body's
        last byte, or the server's close), or, when its body had not ended ``DONE_GRACE_S``
        after "[DONE]", the moment the client closed its connection."""
        return self.closed_unended_ns or self.end_ns

    def finalize(self) -> RawStream:
        """Decode the captured body into events (idempotent); never raises."""
        for _ in self.finalize_steps():
            pass
        return self

    def drop_capture(self) -> None:
        """Let go of the captured bytes and reads (decoded, or the request starts over);
        their share of the run's budget is given back."""
        if self.budget is not None:
            self.budget.release(self._held(), len(self.read_end))
        self.buf = bytearray()
        self.read_t, self.read_user_t, self.read_end = [], [], []
        if self.eager is not None:
            self.eager = Eager(self.eager.classify)

    def _held(self) -> int:
        """The capture's bytes: the raw ones and, decoded ahead, their payload's copy."""
        return len(self.buf) + (len(self.eager.pay) if self.eager is not None else 0)

    def decode_while_arriving(self, classify: Callable[[bytes | None], Classified]) -> None:
        """Decode this stream's complete events as its reads arrive (``advance``, ``Eager``),
        each classified by ``classify`` into ``ev_classified``."""
        self.eager = Eager(classify)
        self.ev_classified = []

    def advance(self) -> None:
        """Decode what the reads so far completed (``Eager``): called by the read callback
        after each read of a stream that is still arriving."""
        e = self.eager
        if e is None or e.frozen:
            return
        if e.raw_pos < 0:  # the body's first read: a streamed answer, or nothing to do
            if self.mode == MODE_HEAD:
                return
            if (
                self.mode != MODE_CHUNKED
                or self.http_status != 200
                or is_json_type(self.content_type)
            ):
                e.frozen = True
                return
            e.raw_pos = self.body_start
        buf = self.buf
        n = len(buf)
        pos = e.raw_pos
        pay, marks, read_end = e.pay, e.marks, self.read_end
        k, nreads = len(marks), len(read_end)
        start = len(pay)
        find = buf.find
        while True:  # the complete chunks: their data copied, their reads' marks set
            i = find(b"\n", pos)
            if i < 0:
                e.frozen = n - pos > 1024  # a size line this long is finalize's error
                break
            line = buf[pos:i]
            try:
                size = int(line, 16)
            except ValueError:
                size = -1
            if size < 0:  # a chunk extension, or a fault (finalize's to report)
                got = chunk_size(line)
                if isinstance(got, str):
                    e.frozen = True
                    break
                size = got
            d = i + 1
            end = d + size
            if size == 0 or end + 2 > n:  # the terminal chunk, or one still arriving
                break
            if buf[end] != 13 or buf[end + 1] != 10:
                e.frozen = True
                break
            plen = len(pay)
            while k < nreads and read_end[k] <= end:
                r_end = read_end[k]
                marks.append(plen + r_end - d if r_end > d else plen)
                k += 1
            pay += buf[d:end]
            pos = end + 2
        e.raw_pos = pos
        if self.budget is not None:
            self.budget.used += len(pay) - start
        base = e.split
        if e.resplit or pay.find(b"\n\n", base) < 0:  # no event completed
            return
        if pay.find(b"\r", start) >= 0:  # split line by line, from the start, at the end
            e.resplit = e.frozen = True
            return
        # the completed events, split, stamped and classified
        events, _rest, error = split_events(bytes(pay[base:]), self.max_event_bytes)
        if error is not None:
            e.frozen = True
        keep = min(self.max_events, CUT_EVENTS_KEPT)
        nmarks = len(marks)
        rt, ru, ev_t, ev_d = self.read_t, self.read_user_t, self.ev_t, self.ev_data
        classified = self.ev_classified
        assert classified is not None
        classify = e.classify
        k = e.k
        for data, nbytes, ev_end in events:
            if data == _DONE or len(ev_t) >= keep:  # finalize's to decide from here
                e.frozen = True
                break
            last = base + ev_end - 1  # the event's last byte; the first read past it stamps it
            while k < nmarks and marks[k] <= last:
                k += 1
            ev_t.append(rt[k])
            self.ev_user_t.append(ru[k])
            self.ev_bytes.append(nbytes)
            ev_d.append(data)
            classified.append(classify(data))
            e.split = base + ev_end
        e.k = k

    def finalize_steps(self) -> Iterator[None]:
        """``finalize`` in resumable pieces: it yields between pieces (body decoding, SSE
        splitting, every ``FINALIZE_STEP_EVENTS`` events stamped) so a caller can serve I/O
        in between. The stream is final once the iterator is exhausted."""
        if self.finalized:
            return
        self.finalized = True
        if self.budget is not None:  # decoding now: no longer waiting in the run's buffers
            self.budget.release(self._held(), len(self.read_end))
            self.budget = None
        try:
            yield from self._finalize()
        except Exception as e:  # a bug here must not lose the request
            self.status = RequestStatus.ERROR
            self.error = f"client failed to decode the stream: {e!r}"
        self.drop_capture()

    def _finalize(self) -> Iterator[None]:
        end = self.end_kind
        if self.mode == MODE_HEAD:
            if self.count_events:
                self.error = f"{self.error} (0 events received)"
            return
        bs = self.body_start
        # a payload byte p arrived with the first read whose mark passes p + shift
        marks: Sequence[int] = self.read_end
        shift = bs
        body_error: str | None = None
        complete = end in (END_BODY, END_DONE)
        rest = 0  # where the events are split from (past those decoded ahead)
        k = 0  # the read that stamped the last event
        resplit = False
        ahead = self.eager
        if self.mode == MODE_CHUNKED and ahead is not None and ahead.raw_pos >= 0:
            # decoded ahead up to ``raw_pos``: the tail now
            tail, tail_marks, chunk_done, body_error = yield from dechunk_steps(
                self.buf, ahead.raw_pos, self.read_end[len(ahead.marks) :]
            )
            base = len(ahead.pay)
            ahead.pay += tail
            ahead.marks.extend([base + a for a in tail_marks])
            payload, marks, shift = bytes(ahead.pay), ahead.marks, 0
            rest, k, resplit = ahead.split, ahead.k, ahead.resplit or b"\r" in tail
            if chunk_done:
                complete = complete or end == END_EOF
        elif self.mode == MODE_CHUNKED:
            payload, marks, chunk_done, body_error = yield from dechunk_steps(
                self.buf, bs, self.read_end
            )
            shift = 0
            if chunk_done:
                complete = complete or end == END_EOF  # terminal chunk with trailers
        else:
            stop = min(len(self.buf), self.body_end) if self.mode == MODE_LENGTH else len(self.buf)
            with memoryview(self.buf) as mv:
                payload = bytes(mv[bs:stop])
            complete = complete or (
                stop == self.body_end if self.mode == MODE_LENGTH else end == END_EOF
            )
        self.buf = bytearray()  # decoded: the raw bytes are not needed any more
        self.body_bytes = len(payload)
        if len(payload) > SMALL_BODY_BYTES:  # I/O between decoding and splitting a big body
            yield
        if self.http_status != 200:
            if self.status is RequestStatus.OK:  # the body ended, was cut off, or closed
                self.status = RequestStatus.ERROR
                self.error = http_error_text(
                    self.http_status,
                    self.content_type,
                    payload[:ERROR_BODY_BYTES],
                    cut=len(payload) > ERROR_BODY_BYTES or end == END_CAP,
                )
            elif self.count_events:
                self.error = f"{self.error} (0 events received)"
            return
        ev_t, ev_u, ev_b, ev_d = self.ev_t, self.ev_user_t, self.ev_bytes, self.ev_data
        if self.status is RequestStatus.OK and is_json_type(self.content_type):
            if complete:
                # a non-streaming answer (stream false): the whole body is one event, received
                # when the body ended (its first token then arrives with the last: TTFT = E2E)
                ev_t.append(self.end_stamp)
                ev_u.append(self.end_stamp)
                ev_b.append(len(payload))
                ev_d.append(payload)
                self.done_ns = self.end_stamp
                return
            if end == END_CAP:
                self.status, self.error = RequestStatus.ERROR, self.cap_reason
                return
        rt, ru = self.read_t, self.read_user_t
        if resplit:  # a CR somewhere: every event split again, line by line
            rest = k = 0
            for kept in (ev_t, ev_u, ev_b, ev_d):
                kept.clear()
            self.ev_classified = [] if self.ev_classified is not None else None
        nreads = len(rt)
        done_i = -1
        # a response cut off by a limit is failed whatever it holds: its first events are
        # decoded and kept, not a million
        max_events = min(self.max_events, CUT_EVENTS_KEPT) if end == END_CAP else self.max_events
        too_many = False
        cr = b"\r" in payload  # lines end in CR or CRLF somewhere: split line by line
        while done_i < 0:  # split and stamp the events, a resumable piece at a time
            events, rest, sse_error = split_events(
                payload, self.max_event_bytes, start=rest, limit=FINALIZE_STEP_EVENTS, cr=cr
            )
            for data, nbytes, e in events:
                if len(ev_t) >= max_events and data != _DONE:
                    too_many = True
                    break
                last = e - 1 + shift  # the event's last byte
                while k + 1 < nreads and marks[k] <= last:
                    k += 1
                ev_t.append(rt[k])
                ev_u.append(ru[k])
                ev_b.append(nbytes)
                ev_d.append(data)
                if data == _DONE:
                    done_i = len(ev_t) - 1
                    break
            if too_many or sse_error is not None or len(events) < FINALIZE_STEP_EVENTS:
                break
            yield
        if done_i >= 0:
            self.done_ns = ev_t[done_i]
            if self.status is RequestStatus.OK or end in (END_EOF, END_CAP):
                self.status, self.error = RequestStatus.OK, None
            return
        error = body_error or sse_error
        if error is None and end == END_CAP:  # cut off: the first limit it went past
            error = self.cap_reason or "response cut off by a client limit"
        if error is None and too_many:
            error = f"response exceeded {max_events:,} events (max_response_events)"
        if error is not None:
            self.status, self.error = RequestStatus.ERROR, error
            if too_many or end == END_CAP:  # failed by a limit: its first events kept
                for kept in (ev_t, ev_u, ev_b, ev_d):
                    del kept[CUT_EVENTS_KEPT:]
            return
        if end == END_DONE:  # a "[DONE]" look-alike that was not an event: cut short
            self.status = RequestStatus.ERROR
            self.error = f"stream cut short at a false [DONE] marker ({len(ev_t)} events received)"
            return
        if complete and self.status is RequestStatus.OK:
            ev = trailing_event(payload[rest:])
            if ev is not None:
                ev_t.append(self.end_stamp)
                ev_u.append(self.end_stamp)
                ev_b.append(ev[1])
                ev_d.append(ev[0])
            self.done_ns = self.end_stamp
            return
        if end == END_EOF:
            self.status = RequestStatus.ERROR
            self.error = f"connection closed mid-stream ({len(ev_t)} events received)"
        elif self.count_events:
            self.error = f"{self.error} ({len(ev_t)} events received)"
