"""The hot path: one streaming HTTP/1.1 request on a raw non-blocking socket.

Timing model
------------
* ``t0`` is ``time.monotonic_ns()`` taken right before ``connect``: connection setup is part
  of TTFT (one connection per request, as a fresh client would see it).
* Plain HTTP on Linux: the socket has ``SO_TIMESTAMPNS`` on and every read is a
  ``recvmsg`` whose ``SCM_TIMESTAMPNS`` control message is the kernel's receive time of the
  (last) segment the read returned, on ``CLOCK_REALTIME``. ``ClockMap`` converts it to the
  monotonic clock with an offset ``realtime - monotonic`` sampled at run start and re-sampled
  during the run (the runner's monitor does it about once a second and records the drift),
  so an NTP slew or step cannot bend a run by more than about a second's worth of slew.
  Kernel stamps do not depend on when the event loop got round to reading: a busy client
  still measures arrival times right, as long as the reads do not coalesce several events
  (events completed by one read all share its stamp).
* HTTPS gets the same kernel stamps: TLS runs over the same raw socket through
  ``ssl.SSLContext.wrap_bio`` (memory BIOs), driven by the same loop callbacks. Each TCP read
  is stamped as above, fed to the TLS object, and the plaintext it made available (possibly
  none) is recorded with that read's stamp. So an event gets the stamp of the TCP read that
  completed the TLS record holding its last byte. The TLS handshake counts in TTFT, like
  ``connect``; reads that only carried handshake bytes count for ``RawStream.clock`` too.
* Otherwise (non-Linux, option refused, ``kernel_stamps=False``) each read is stamped
  with ``time.monotonic_ns()`` first thing in the read callback (user-space stamps).

HTTP framing: the request bytes are formatted once (``build_request``, the runner does it
before the request is due). The read callback does as little as possible: one
``recvmsg_into`` into a per-thread buffer, the stamp, an append of the bytes to the stream's
``bytearray`` and of ``(stamp, user stamp, end offset)`` to three int lists, then a cheap end
check: the response head is parsed once (status, chunked / Content-Length / until-close); the
end is the terminal chunk at the tail (``\r\n0\r\n\r\n``; with trailers, the server's close),
the byte count, EOF, or a complete ``data: [DONE]`` line near the tail. Two integer compares
bound memory (``app.client.limits``): the response's bytes (``max_response_bytes``; a JSON
answer's: ``max_event_bytes``; an error status's body: ``ERROR_BODY_BYTES``) and the run's
``BufferBudget`` (``max_buffered_bytes``), which each read is added to. No chunk decoding,
SSE splitting or JSON happens there.

``RawStream.finalize()`` (``app.client.raw_stream``, the one decoder; run by
``StreamRequest.run()``, by the runner between I/O rounds, or by a session where its reply
ended) decodes the body, splits the SSE events and maps each event's last byte back to the
read that delivered it: an event gets that read's stamp, the same semantics as decoding in
the callback, at a fraction of the per-read cost.

An EOF (read-until-close body) carries no segment, hence no kernel stamp: its read is
stamped in user space and not counted against ``RawStream.clock``.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from app.client.clocks import (
    ANCBUF,
    SCM_TIMESTAMPNS,
    TIMESPEC,
    ClockMap,
    kernel_stamps_supported,
)
from app.client.conn_io import ConnIO
from app.client.connpool import (
    Conn,
    ConnPool,
    is_stale_error,
    read_tx_stamps,
    tx_stamps_supported,
)
from app.client.eventloop import StampingSelector, stamping_selector
from app.client.http_request import Target, build_request, default_ssl_context, is_json_type
from app.client.http_response import LAST_CHUNK, done_at, read_head
from app.client.limits import (
    DEFAULT_MAX_EVENT_BYTES,
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_MAX_RESPONSE_EVENTS,
    ERROR_BODY_BYTES,
    READ_COST,
    BufferBudget,
)
from app.client.raw_stream import (
    END_BODY,
    END_CAP,
    END_DONE,
    END_EOF,
    MODE_CHUNKED,
    MODE_CLOSE,
    MODE_HEAD,
    MODE_LENGTH,
    RawStream,
)
from app.client.sockets import os_error
from app.client.tls_io import TlsIO
from app.domain import ClockSource, RequestStatus

_SOL_SOCKET = socket.SOL_SOCKET

# --------------------------------------------------------------------------- one stream

_tls = threading.local()


def _read_buffer(size: int) -> list[memoryview]:
    """A per-thread receive buffer (reads are copied out of it at once)."""
    bufs: dict[int, list[memoryview]] | None = getattr(_tls, "bufs", None)
    if bufs is None:
        bufs = _tls.bufs = {}
    b = bufs.get(size)
    if b is None:
        b = bufs[size] = [memoryview(bytearray(size))]
    return b


DONE_GRACE_S = 0.5  # how long after "[DONE]" the body's own end may take


class StreamRequest(ConnIO, TlsIO):
    """One streaming request. ``await run()`` returns its ``RawStream``; ``abort()`` ends it.

    ``addr`` is a resolved socket address (resolve once per run: DNS is not part of TTFT).
    ``request_bytes``, when given, is the prebuilt request (``build_request``).
    ``ssl_context`` is used for ``https`` targets; by default the system's trust store with
    certificate and host name verification on (``default_ssl_context``).

    ``pool``: where the request takes an open connection from and gives it back once the
    response ended cleanly (keep-alive); without one, or in a pool that does not keep
    connections, every request opens its own and closes it. A request that fails on a
    reused connection before any response byte (the server had closed it) is retried once
    on a new connection (``raw.retries``).

    ``on_end``: called in the read callback where the response ended (status OK), once its
    connection was given back (what it starts can reuse it): a session sends its next turn
    from there (``app.client.sessions``), decoding the reply with ``RawStream.finalize``.
    """

    __slots__ = ()  # every attribute is ``StreamState``'s

    def __init__(
        self,
        target: Target,
        addr: tuple[Any, ...],
        family: int,
        path: str,
        body: bytes,
        headers: list[tuple[str, str]],
        *,
        request_id: str,
        timeout_s: float,
        clock: ClockMap,
        kernel_stamps: bool = True,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_response_events: int = DEFAULT_MAX_RESPONSE_EVENTS,
        budget: BufferBudget | None = None,
        bufsize: int = 65536,
        request_bytes: bytes | None = None,
        ssl_context: ssl.SSLContext | None = None,
        pool: ConnPool | None = None,
        done_grace_s: float = DONE_GRACE_S,
        on_end: Callable[[RawStream], None] | None = None,
    ) -> None:
        self._target = target
        self._on_end = on_end
        self._reserved: Conn | None = None  # a pooled connection taken ahead (``reserve``)
        self._addr = addr
        self._family = family
        self._timeout_s = timeout_s
        self._clock = clock
        self._kernel = kernel_stamps and kernel_stamps_supported()
        self._tx = self._kernel and tx_stamps_supported()
        self._anc = ANCBUF if self._kernel else 0
        self._rbuf = _read_buffer(bufsize)
        self._max_bytes = max_response_bytes
        self._budget = budget  # the run's: every read of this stream is counted in it
        self._req_bytes = (
            request_bytes if request_bytes is not None else build_request(path, headers, body)
        )
        self._pool = pool
        self._keep_alive = pool is not None and pool.keep_alive
        self._done_grace_s = done_grace_s
        self._sent = 0  # bytes of this request handed to the socket (plain HTTP)
        self._app_start = 0  # connection byte offset of the request's first byte
        self._app_end = 0  # ... just past its last byte (TLS: ciphertext offsets)
        self.raw = RawStream(
            request_id=request_id,
            max_event_bytes=max_event_bytes,
            max_events=max_response_events,
            budget=budget,
        )
        self._finished = False
        self._conn: Conn | None = None
        self._reader_fd = -1
        self._writer_fd = -1
        self._timer: asyncio.TimerHandle | None = None
        self._done_timer: asyncio.TimerHandle | None = None
        self._done_seen = False
        self._done_stamp = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sel: StampingSelector | None = None
        self._done: asyncio.Future[None] | None = None
        self._ssl_ctx = (ssl_context or default_ssl_context()) if target.tls else None
        self._tls_out = bytearray()  # ciphertext not yet accepted by the socket
        self._hs_done = False

    # ---- control

    def abort(self, status: RequestStatus, reason: str) -> None:
        """End the request now (timeout, run stopped); what was measured is kept."""
        self.raw.count_events = False
        self._finish(status, reason, time.monotonic_ns())

    def _on_timeout(self) -> None:
        if self._done_seen and not self._finished:  # complete but for its body's end
            self._done_late()
            return
        r = self.raw
        conn = self._conn
        msg = f"request timeout after {self._timeout_s:g} s, "
        if conn is not None and conn.ssl is not None and not self._hs_done:
            msg += "during the TLS handshake"
        elif r.mode == MODE_HEAD:
            msg += "waiting for the response headers"
        else:
            msg += "streaming"
            r.count_events = True
        self._finish(RequestStatus.TIMEOUT, msg, time.monotonic_ns())

    def _unregister(self) -> None:
        loop = self._loop
        if loop is None:
            return
        if self._reader_fd >= 0:  # the connection stays registered (``Conn.watch``)
            if self._conn is not None:
                self._conn.unwatch()
            self._reader_fd = -1
        if self._writer_fd >= 0:
            loop.remove_writer(self._writer_fd)
            self._writer_fd = -1

    def _finish(self, status: RequestStatus, error: str | None, t_ns: int) -> None:
        if self._finished:
            return
        self._finished = True
        r = self.raw
        r.status = status
        r.error = error
        r.end_ns = t_ns
        self._unregister()
        if self._done_timer is not None:
            self._done_timer.cancel()
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _end(self, kind: int, stamp: int) -> None:
        """The response ended (``kind``): keep the connection when its framing ended
        cleanly and nobody asked to close it."""
        r = self.raw
        r.end_kind = kind
        r.end_stamp = stamp
        r.keep_alive = (
            self._keep_alive
            and kind == END_BODY
            and r.mode in (MODE_CHUNKED, MODE_LENGTH)
            and not r.server_close
            and (r.mode != MODE_LENGTH or len(r.buf) == r.body_end)
        )
        self._finish(RequestStatus.OK, None, stamp)
        on_end = self._on_end
        if on_end is not None:
            self._close_out()  # give the connection back now: ``on_end`` may start the next
            on_end(r)

    # ---- run

    async def run(self, *, finalize: bool = True) -> RawStream:
        """Run the request. With ``finalize=False`` the body is left undecoded: call
        ``raw.finalize()`` later (the runner does it between I/O rounds)."""
        self.start()
        return await self.wait(finalize=finalize)

    def start(self) -> None:
        """Start the request now, on the running loop, without a task switch: connect (or
        take a kept-alive connection) and send from here (``run`` = ``start`` + ``wait``).
        The caller must then ``await wait()``, which releases what the request holds."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._sel = stamping_selector(loop)
        self._done = loop.create_future()
        self._timer = loop.call_later(self._timeout_s, self._on_timeout)
        try:
            self._start()
        except BaseException:
            self._close_out()
            raise

    async def wait(self, *, finalize: bool = True) -> RawStream:
        """Wait for the request ``start`` began to end; its ``RawStream`` (finalized unless
        ``finalize=False``)."""
        assert self._done is not None, "start() first"
        try:
            await self._done
        finally:
            self._close_out()
        r = self.raw
        if r.kernel_reads and not r.user_reads:
            r.clock = ClockSource.KERNEL
        return r.finalize() if finalize else r

    def _close_out(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if not self._finished:  # cancelled from outside
            self._finish(RequestStatus.CANCELLED, "request cancelled", time.monotonic_ns())
        self._release()

    def _request_start(self) -> None:
        """The connection is ready: send the request (t0's fallback is read right here)."""
        conn = self._conn
        assert conn is not None
        if conn.ssl is not None:
            self._tls_write_request()
            return
        self._app_start = conn.sent
        self._app_end = conn.sent + len(self._req_bytes)
        self._sent = 0
        self.raw.t0_ns = time.monotonic_ns()
        self._send()

    def _send(self) -> None:
        conn = self._conn
        loop = self._loop
        assert conn is not None and loop is not None
        sock = conn.sock
        req = self._req_bytes
        total = len(req)
        while self._sent < total:
            # the first segment goes alone: its transmit stamp is the first byte's
            end = min(total, conn.mss) if self._sent == 0 and conn.tx else total
            try:
                n = sock.send(req[self._sent : end] if self._sent or end < total else req)
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as e:
                if not (is_stale_error(e.errno or 0) and self._retry()):
                    self._finish(
                        RequestStatus.ERROR, os_error("connect/send", e), time.monotonic_ns()
                    )
                return
            if n:
                self.raw.sent_any = True
            self._sent += n
            conn.sent += n
            if n < end - (self._sent - n):
                break  # the socket took less: wait until it is writable
        fd = sock.fileno()
        if self._sent < total:
            if self._writer_fd < 0:
                self._writer_fd = fd
                loop.add_writer(fd, self._on_writable)
            return
        self.raw.sent_end_ns = time.monotonic_ns()
        if conn.tx:  # loopback stamps at once; a NIC's later stamp wakes the reader
            read_tx_stamps(sock, conn.tx_stamps, self._app_end - 1)
        if self._writer_fd >= 0:
            loop.remove_writer(self._writer_fd)
            self._writer_fd = -1
        if self._reader_fd < 0:
            self._reader_fd = fd
            conn.watch(loop, self._on_readable)

    # ---- the read callbacks (keep them small: no decoding here)

    def _stamp(self, anc: list[tuple[int, int, bytes]], t_user: int) -> int:
        """A read's stamp: the kernel's receive time when ``anc`` carries it, else the
        user-space one: when the poll that reported this socket returned (the data was there
        then), else ``t_user`` (now)."""
        sel = self._sel
        stamp = sel.ready_ns if sel is not None and 0 < sel.ready_ns <= t_user else t_user
        for level, typ, cdata in anc:
            if level == _SOL_SOCKET and typ == SCM_TIMESTAMPNS:
                sec, nsec = TIMESPEC.unpack_from(cdata)
                k = sec * 1_000_000_000 + nsec - self._clock.offset_ns
                stamp = k if k < t_user else t_user
        return stamp

    def _on_readable(self) -> None:
        t_user = time.monotonic_ns()
        rbuf = self._rbuf
        conn = self._conn
        assert conn is not None
        try:
            n, anc, _flags, _addr = conn.sock.recvmsg_into(rbuf, self._anc)
        except (BlockingIOError, InterruptedError):
            if conn.tx:  # woken by the error queue (a transmit stamp), not by data
                read_tx_stamps(conn.sock, conn.tx_stamps)
            return
        except OSError as e:
            if not (is_stale_error(e.errno or 0) and self._retry()):
                self._finish(RequestStatus.ERROR, os_error("read", e), t_user)
            return
        r = self.raw
        stamp = self._stamp(anc, t_user)
        if anc:
            r.kernel_reads += 1
        elif n:
            r.user_reads += 1
        else:  # an EOF read carries no segment, hence no kernel stamp: not counted
            if not self._retry():
                self._on_eof(t_user)
            return
        buf = r.buf
        old = len(buf)
        buf += rbuf[0][:n]
        self._took(old, n, stamp, t_user)

    def _took(self, old: int, n: int, stamp: int, t_user: int) -> None:
        """Record a read of ``n`` bytes appended at ``old``; detect the end of the response."""
        r = self.raw
        buf = r.buf
        total = old + n
        r.read_t.append(stamp)
        r.read_user_t.append(t_user)
        r.read_end.append(total)
        b = self._budget
        if b is not None:
            b.used += n + READ_COST
        mode = r.mode
        if mode == MODE_HEAD:
            self._on_head(stamp)
            mode = r.mode
            if mode == MODE_HEAD or self._finished:
                return
        if mode == MODE_CHUNKED:
            if buf.endswith(LAST_CHUNK):
                self._end(END_BODY, stamp)
                return
        elif mode == MODE_LENGTH and total >= r.body_end:
            self._end(END_BODY, stamp)
            return
        if not self._done_seen:
            bs = r.body_start
            j = buf.find(b"[DONE]", max(bs, old - 12))
            if j >= 0 and r.http_status == 200 and done_at(buf, j, bs) >= 0:
                # the response ends where its body does, whatever the framing: what follows
                # it (a session's next turn, a request on its connection) never overtakes it
                self._done_seen, self._done_stamp = True, stamp
                assert self._loop is not None
                self._done_timer = self._loop.call_later(self._done_grace_s, self._done_late)
        if total > self._max_bytes or (b is not None and b.used > b.limit):
            self._cap(stamp)
        elif r.eager is not None:  # a reply whose end is awaited: decoded as it arrives
            r.advance()

    def _cap(self, stamp: int) -> None:
        """The response went past a client limit (``app.client.limits``): it ends here, and
        ``finalize`` fails it naming the limit (the events before the cut are kept)."""
        r = self.raw
        if len(r.buf) > self._max_bytes:
            if r.http_status == 200 and is_json_type(r.content_type):
                r.cap_reason = (
                    f"JSON answer larger than {r.max_event_bytes:,} bytes (max_event_bytes)"
                )
            else:
                r.cap_reason = f"response exceeded {self._max_bytes:,} bytes (max_response_bytes)"
        elif self._budget is not None:
            r.cap_reason = self._budget.reason
        self._end(END_CAP, stamp)

    def _done_late(self) -> None:
        """``[DONE]`` came but the body never ended: the stream is complete (it ended at
        ``[DONE]``), its connection is closed unfinished now (``RawStream.wire_end_ns``)."""
        self.raw.closed_unended_ns = time.monotonic_ns()
        self._end(END_DONE, self._done_stamp)

    def _on_head(self, stamp: int) -> None:
        """Read the final response head once it is complete (``read_head``)."""
        r = self.raw
        head = read_head(r.buf, r.body_start if r.body_start > 0 else 0)
        if isinstance(head, int):  # not complete: look from past the 1xx heads next time
            r.body_start = head if head > 0 else r.body_start
            return
        if isinstance(head, str):
            self._finish(RequestStatus.ERROR, f"HTTP protocol error: {head}", stamp)
            return
        pos = head.body_start
        r.http_status, r.body_start, r.head_ns = head.status, pos, stamp
        r.content_type = head.content_type
        # of an error answer only its message is kept; a JSON answer is one event
        if head.status != 200:
            self._max_bytes = min(self._max_bytes, pos + ERROR_BODY_BYTES)
        elif head.json:
            self._max_bytes = min(self._max_bytes, pos + r.max_event_bytes)
        r.server_close = r.server_close or head.server_close
        r.mode, r.body_end = head.mode, head.body_end
        r.read_to_close = head.mode == MODE_CLOSE

    def _on_eof(self, stamp: int) -> None:
        r = self.raw
        if r.mode == MODE_HEAD:
            self._finish(
                RequestStatus.ERROR, "server closed the connection without a response", stamp
            )
        elif r.mode == MODE_CLOSE:
            self._end(END_BODY, stamp)
        else:  # finalize decides: a chunked body may have ended with trailers
            r.end_kind = END_EOF
            r.end_stamp = stamp
            self._finish(RequestStatus.OK, None, stamp)
