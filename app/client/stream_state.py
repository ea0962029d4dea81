"""The state of one request on a raw socket (``app.client.http_stream.StreamRequest``),
shared by the parts its methods live in: ``conn_io`` (its connection: taken, opened, given
back; its transmit stamps), ``tls_io`` (HTTPS over memory BIOs) and ``http_stream`` (the
send, the read callbacks, the response's end). One class holds every slot, so the parts
combine without a layout conflict; the methods one part calls of another are declared here.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any

from app.client.clocks import ClockMap
from app.client.connpool import Conn, ConnPool
from app.client.eventloop import StampingSelector
from app.client.http_request import Target
from app.client.limits import BufferBudget
from app.client.raw_stream import RawStream
from app.domain import RequestStatus


class StreamState:
    """Every attribute of a ``StreamRequest`` (set in its ``__init__``)."""

    __slots__ = (
        "_addr",
        "_anc",
        "_app_end",
        "_app_start",
        "_budget",
        "_clock",
        "_conn",
        "_done",
        "_done_grace_s",
        "_done_seen",
        "_done_stamp",
        "_done_timer",
        "_family",
        "_finished",
        "_hs_done",
        "_keep_alive",
        "_kernel",
        "_loop",
        "_max_bytes",
        "_on_end",
        "_pool",
        "_rbuf",
        "_reader_fd",
        "_req_bytes",
        "_reserved",
        "_sel",
        "_sent",
        "_ssl_ctx",
        "_target",
        "_timeout_s",
        "_timer",
        "_tls_out",
        "_tx",
        "_writer_fd",
        "raw",
    )  # fmt: skip

    _addr: tuple[Any, ...]  # the resolved socket address
    _anc: int  # the ancillary buffer a read asks for (0: no kernel receive stamps)
    _app_end: int  # the connection byte offset just past the request (TLS: ciphertext)
    _app_start: int  # ... of the request's first byte
    _budget: BufferBudget | None  # the run's: every read of this stream is counted in it
    _clock: ClockMap
    _conn: Conn | None
    _done: asyncio.Future[None] | None
    _done_grace_s: float  # how long after "[DONE]" the body's own end may take
    _done_seen: bool
    _done_stamp: int
    _done_timer: asyncio.TimerHandle | None
    _family: int
    _finished: bool
    _hs_done: bool  # the TLS handshake is over (plain HTTP: always)
    _keep_alive: bool
    _kernel: bool  # kernel receive stamps
    _loop: asyncio.AbstractEventLoop | None
    _max_bytes: int
    _on_end: Callable[[RawStream], None] | None
    _pool: ConnPool | None
    _rbuf: list[memoryview]
    _reader_fd: int
    _req_bytes: bytes
    _reserved: Conn | None  # a pooled connection taken ahead (``reserve``)
    _sel: StampingSelector | None
    _sent: int  # bytes of this request handed to the socket (plain HTTP)
    _ssl_ctx: ssl.SSLContext | None
    _target: Target
    _timeout_s: float
    _timer: asyncio.TimerHandle | None
    _tls_out: bytearray  # ciphertext not yet accepted by the socket
    _tx: bool  # kernel transmit stamps
    _writer_fd: int
    raw: RawStream

    # what one part calls of another's (methods of ``StreamRequest``'s parts: declared
    # here so each part type-checks alone; never assigned)
    _finish: Callable[[RequestStatus, str | None, int], None]
    _unregister: Callable[[], None]
    _retry: Callable[[], bool]
    _request_start: Callable[[], None]
    _send: Callable[[], None]
    _on_writable: Callable[[], None]
    _stamp: Callable[[list[tuple[int, int, bytes]], int], int]
    _took: Callable[[int, int, int, int], None]
    _on_eof: Callable[[int], None]
    _tls_advance: Callable[[], None]
    _tls_write_request: Callable[[], None]
