"""HTTP/1.1 on one connection, with h11 and no web framework: ``HttpProtocol`` parses each
request (400 on a bad one, 413 past ``max_body_bytes``, ``100 Continue``), hands the whole
request to the server's ``handle``, writes whole responses (``send_simple``) and the head of
an SSE stream (``start_stream``, chunked, written by hand), and owns keep-alive: after a
response is written whole it waits for the next request, closes when the client asked,
keep-alive is off, ``max_requests_per_conn`` is reached or ``idle_timeout_s`` passes, and
aborts with an RST for a disconnect fault. It also notes each request's first byte (kernel
stamp when there is one) and the JSON bodies it answers with (``json_bytes``,
``error_body``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import Sequence
from time import monotonic_ns
from typing import Protocol

import h11

from app.targets.sim_config import SimConfig
from app.targets.simulator.records import Record
from app.targets.simulator.stamps import StampSocket

_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nserver: tokentrace-sim\r\n"
    b"content-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n"
)
_CLOSE_HEADER = b"connection: close\r\n"
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def json_bytes(obj: object) -> bytes:
    """Compact JSON."""
    return _ENCODER.encode(obj).encode()


def error_body(message: str, kind: str, code: int | None = None) -> bytes:
    return json_bytes({"error": {"message": message, "type": kind, "code": code}})


class Server(Protocol):
    """What a connection needs of the server (``SimServer``)."""

    config: SimConfig
    clock_offset_ns: int

    def track(self, proto: HttpProtocol) -> None: ...

    def untrack(self, proto: HttpProtocol) -> None: ...

    def handle(
        self, proto: HttpProtocol, req: h11.Request, body: bytes, received_ns: int
    ) -> None: ...


class Generation(Protocol):
    """The request being generated on a connection (``generator.Gen``)."""

    def release(self) -> None: ...


class HttpProtocol(asyncio.Protocol):
    """One connection: h11 parses each request; the response is written by the server.

    Keep-alive: once a response has been written whole, the connection waits for the next
    request (closed after ``idle_timeout_s``), unless the client asked to close, keep-alive
    is off, or ``max_requests_per_conn`` is reached (that response says so).
    """

    def __init__(self, srv: Server, conn_seq: int = 0) -> None:
        self._srv = srv
        self._h11 = h11.Connection(h11.SERVER)
        self.transport: asyncio.Transport | None = None
        self._request: h11.Request | None = None
        self._body = bytearray()
        self._handled = False
        self._pending = bytearray()  # bytes that arrived while a response was being written
        self._started = False  # some byte of the current request arrived
        self._first_rx_ns = 0  # its first byte: kernel stamp (monotonic) or user-space time
        self._first_rx_clock = "userspace"
        self._idle: asyncio.TimerHandle | None = None
        self._sock: StampSocket | None = None
        self.closed = False
        self.gen: Generation | None = None
        self.record: Record | None = None
        self.request_id = ""
        self.conn_seq = conn_seq  # the server's count of accepted connections, this one's
        self.served = 0  # responses written whole on this connection
        self.last = False  # the response being written is the connection's last

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._srv.track(self)
        ts = transport.get_extra_info("socket")
        raw = getattr(ts, "_sock", ts)
        if isinstance(raw, StampSocket) and self._srv.config.kernel_rx_stamps:
            self._sock = raw  # stamping since accept (StampSocket.accept)

    def data_received(self, data: bytes) -> None:
        received_ns = monotonic_ns()
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._handled:
            self._pending += data
            return
        if not self._started and data:
            self._started = True
            self._note_first_byte(received_ns)
        self._h11.receive_data(data)
        self._pump(received_ns)

    def _note_first_byte(self, received_ns: int) -> None:
        sock = self._sock
        if sock is not None and sock.rx_real_ns:
            t = sock.rx_real_ns - self._srv.clock_offset_ns
            if t <= received_ns:
                self._first_rx_ns, self._first_rx_clock = t, "kernel"
                return
        self._first_rx_ns, self._first_rx_clock = received_ns, "userspace"

    @property
    def stamp_socket(self) -> StampSocket | None:
        return self._sock

    def note_request(self, rec: Record) -> None:
        rec.first_byte_rx_ns = self._first_rx_ns or rec.received_ns
        rec.rx_clock = self._first_rx_clock
        rec.conn = self.conn_seq
        rec.conn_request = self.served + 1

    def decide_last(self, req: h11.Request | None) -> None:
        """Is the response about to be written this connection's last?"""
        cfg = self._srv.config
        asked_close = False
        if req is not None:
            for name, value in req.headers.raw_items():
                if name.lower() == b"connection" and b"close" in value.lower():
                    asked_close = True
            asked_close = asked_close or req.http_version == b"1.0"
        cap = cfg.max_requests_per_conn
        self.last = (
            not cfg.keep_alive or asked_close or req is None or bool(cap and self.served + 1 >= cap)
        )

    def response_done(self) -> None:
        """The response has been written whole: close, or wait for the next request."""
        if self.closed:
            return
        self.served += 1
        if self.last:
            self.close()
            return
        self._h11 = h11.Connection(h11.SERVER)
        self._request = None
        self._body = bytearray()
        self._handled = False
        self._started = False
        self.gen = None
        self.record = None
        self.request_id = ""
        pending, self._pending = bytes(self._pending), bytearray()
        timeout = self._srv.config.idle_timeout_s
        if pending:
            self.data_received(pending)
        elif timeout > 0 and self.transport is not None:
            self._idle = asyncio.get_running_loop().call_later(timeout, self.close)

    def eof_received(self) -> bool:
        if not self._handled:
            self._h11.receive_data(b"")
            self._pump(monotonic_ns())
        return False  # the client went away (like real servers, no half-close): close

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._idle is not None:
            self._idle.cancel()
        self._srv.untrack(self)
        if self.gen is not None:
            self.gen.release()
        if self.record is not None and self.record.closed_ns is None:
            self.record.closed_ns = monotonic_ns()

    # parsing
    def _pump(self, received_ns: int) -> None:
        while True:
            try:
                event = self._h11.next_event()
            except h11.RemoteProtocolError as e:
                self._handled = True
                self.last = True
                self.send_simple(400, error_body(f"bad HTTP request: {e}", "invalid_request"))
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                self._request = event
                if self._h11.they_are_waiting_for_100_continue:
                    cont = h11.InformationalResponse(status_code=100, headers=[])
                    self._write(self._h11.send(cont))
            elif isinstance(event, h11.Data):
                self._body += event.data
                if len(self._body) > self._srv.config.max_body_bytes:
                    self._handled = True
                    self.last = True
                    self.send_simple(413, error_body("request body too large", "invalid_request"))
                    return
            elif isinstance(event, h11.EndOfMessage):
                self._handled = True
                assert self._request is not None
                self.decide_last(self._request)
                self._srv.handle(self, self._request, bytes(self._body), received_ns)
                return
            else:  # ConnectionClosed before a whole request
                self._handled = True
                self.close()
                return

    # writing
    def _write(self, data: bytes | None) -> int:
        t = monotonic_ns()
        if data and self.transport is not None and not self.closed:
            self.transport.write(data)
        return t

    def _headers(self, extra: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        h = [("server", "tokentrace-sim"), *extra]
        if self.last:
            h.insert(1, ("connection", "close"))
        if self.request_id:
            h.append(("x-request-id", self.request_id))
        return h

    def send_simple(self, status: int, body: bytes, content_type: str = "application/json") -> int:
        """A whole response with a Content-Length, then keep-alive or close
        (``response_done``). Returns the stamp."""
        req = self._request
        if req is not None and req.method != b"HEAD" and self._h11.our_state is h11.SEND_RESPONSE:
            # The head written by hand, as h11 writes it (its header validation cost ~50 us a
            # response): the names and values are ours, the request id was validated when it
            # arrived. h11 is not used again on this connection (``response_done``).
            head = b"HTTP/1.1 %d \r\nserver: tokentrace-sim\r\n" % status
            if self.last:
                head += _CLOSE_HEADER
            head += b"content-type: %s\r\ncontent-length: %d\r\n" % (
                content_type.encode("latin-1"),
                len(body),
            )
            if self.request_id:
                head += b"x-request-id: " + self.request_id.encode("latin-1") + b"\r\n"
            t = self._write(head + b"\r\n" + body)
            self.response_done()
            return t
        headers = self._headers(
            [("content-type", content_type), ("content-length", str(len(body)))]
        )
        try:
            data = self._h11.send(h11.Response(status_code=status, headers=headers))
            data = (data or b"") + (self._h11.send(h11.Data(data=body)) or b"") if body else data
            data = (data or b"") + (self._h11.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:
            self.close()
            return monotonic_ns()
        t = self._write(data)
        self.response_done()
        return t

    def start_stream(self, first_chunks: bytes) -> int:
        """Response head for an SSE stream (chunked), plus any first chunks, in one write."""
        # Written by hand (h11's header validation costs ~50 us a request) and so is the
        # chunked body: h11 is not used again on this connection. The request id is safe in
        # a header: h11 validated it when it arrived.
        head = _STREAM_HEAD + _CLOSE_HEADER if self.last else _STREAM_HEAD
        if self.request_id:
            head += b"x-request-id: " + self.request_id.encode("latin-1") + b"\r\n"
        return self._write(head + b"\r\n" + first_chunks)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()

    def abort(self) -> None:
        """Abortive close: SO_LINGER 0 makes the kernel send an RST."""
        if self.transport is None or self.closed:
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()
