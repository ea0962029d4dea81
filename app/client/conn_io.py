"""A request's connection (``app.client.http_stream.StreamRequest``): a kept-alive one
taken from the run's pool (or reserved ahead of the send), else a new one opened with a
non-blocking connect, its socket options set (kernel receive stamps, ``TCP_NODELAY``,
transmit stamps once connected); a request that fails on a reused connection before any
response byte is retried once on a new one. Once the response is over, ``t0`` and the end of
sending are resolved from the transmit stamps and the connection is given back or closed.
"""

from __future__ import annotations

import errno
import os
import socket
import ssl
import time

from app.client.connpool import (
    Conn,
    first_stamp_at_or_after,
    read_tx_stamps,
)
from app.client.raw_stream import MODE_HEAD
from app.client.sockets import os_error, stream_socket
from app.client.stream_state import StreamState
from app.domain import ClockSource, RequestStatus


class ConnIO(StreamState):
    """The connection methods of ``StreamRequest``."""

    __slots__ = ()

    def _release(self) -> None:
        """Resolve ``t0`` from the transmit stamps, then keep or close the connection."""
        conn = self._conn
        if conn is None:
            return
        self._conn = None
        r = self.raw
        if conn.tx:
            stamps = conn.tx_stamps
            if not (stamps and stamps[-1][0] >= self._app_end - 1 >= 0 and r.sent_any):
                read_tx_stamps(conn.sock, stamps)  # its last byte's stamp is not here yet
            self._resolve_send_stamps(conn)
        pool = self._pool
        if r.keep_alive and pool is not None:
            conn.requests += 1
            pool.give(conn)
        elif pool is not None:
            pool.discard(conn)
        else:
            conn.close()
        if r.server_close and pool is not None:
            pool.stats.closed_by_server += 1
        if r.read_to_close and pool is not None:
            pool.stats.read_to_close += 1

    def _resolve_send_stamps(self, conn: Conn) -> None:
        """``t0`` = the transmit stamp of the send that carried the request's first byte;
        the end of sending = that of its last byte. A stamp that is missing, or later than
        the first byte of the response, leaves the user-space times in place."""
        r = self.raw
        stamps = conn.tx_stamps
        if r.sent_any and stamps:
            first = first_stamp_at_or_after(stamps, self._app_start)
            last = first_stamp_at_or_after(stamps, self._app_end - 1)
            limit = r.read_t[0] if r.read_t else (r.end_ns or time.monotonic_ns())
            if first is not None:
                t0 = self._clock.to_monotonic(first)
                if r.io_start_ns <= t0 <= limit:
                    r.t0_ns = t0
                    r.send_clock = ClockSource.KERNEL
                    if last is not None:
                        t1 = self._clock.to_monotonic(last)
                        if t0 <= t1 <= limit:
                            r.sent_end_ns = t1
        stamps.clear()

    def reserve(self) -> None:
        """Take the kept-alive connection ``start`` will use now, ahead of the send: the
        pool's check that the server has not closed it (for a connection never registered
        with the loop, a ``recv`` peek: ~50 µs on loopback, the kernel's pending work on the
        socket included) then happens before the request is due; one found closed while
        reserved is dropped at the start. ``unreserve`` gives it back when the request is
        not started."""
        if self._keep_alive and self._pool is not None and self._reserved is None:
            self._reserved = self._pool.take(self._addr)

    def unreserve(self) -> None:
        conn, self._reserved = self._reserved, None
        if conn is not None and self._pool is not None:
            self._pool.give(conn)

    def _start(self) -> None:
        """Take an open connection or open one; send from callbacks (no futures or task
        switches on the way)."""
        r = self.raw
        r.io_start_ns = r.t0_ns = time.monotonic_ns()
        conn, self._reserved = self._reserved, None
        if conn is not None and conn.dead and self._pool is not None:  # closed since taken
            self._pool.stats.closed_idle += 1
            self._pool.discard(conn)
            conn = None
        if conn is None and self._keep_alive and self._pool is not None:
            conn = self._pool.take(self._addr)
        if conn is None:
            self._open()
            return
        assert self._pool is not None
        self._pool.stats.reused += 1
        self._conn = conn
        r.conn_id = conn.id
        r.conn_reused = True
        self._hs_done = True
        self._request_start()

    def _open(self) -> None:
        """A new connection: socket, options, non-blocking connect."""
        r = self.raw
        loop = self._loop
        assert loop is not None
        ssl_obj = in_bio = out_bio = None
        if self._ssl_ctx is not None:
            try:
                in_bio = ssl.MemoryBIO()
                out_bio = ssl.MemoryBIO()
                ssl_obj = self._ssl_ctx.wrap_bio(in_bio, out_bio, server_hostname=self._target.host)
            except (ssl.SSLError, ValueError) as e:
                self._finish(RequestStatus.ERROR, os_error("tls setup", e), time.monotonic_ns())
                return
        try:
            sock, kernel = stream_socket(self._family, self._kernel)
        except OSError as e:
            self._finish(RequestStatus.ERROR, os_error("connect/send", e), time.monotonic_ns())
            return
        pool = self._pool
        conn = Conn(pool.new_id() if pool else 1, sock, self._family, key=self._addr)
        conn.ssl, conn.in_bio, conn.out_bio = ssl_obj, in_bio, out_bio
        self._conn = conn
        self._hs_done = ssl_obj is None
        r.conn_id = conn.id
        r.conn_reused = False
        if self._kernel and not kernel:  # the kernel refused receive stamps
            self._kernel = False
            self._tx = False
            self._anc = 0
        r.connect_start_ns = time.monotonic_ns()
        err = sock.connect_ex(self._addr)
        if err == 0 or err == errno.EISCONN:
            self._connected()
        elif err in (errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
            self._writer_fd = sock.fileno()
            loop.add_writer(self._writer_fd, self._on_writable)
        else:
            self._connect_failed(err)

    def _connect_failed(self, err: int) -> None:
        e = OSError(err, os.strerror(err))  # OSError picks the subclass from errno
        self._finish(RequestStatus.ERROR, os_error("connect/send", e), time.monotonic_ns())

    def _connected(self) -> None:
        conn = self._conn
        assert conn is not None
        self.raw.connect_end_ns = time.monotonic_ns()
        if self._tx:
            conn.enable_tx()
        if conn.ssl is not None:
            self._tls_advance()
        else:
            self._request_start()

    def _retry(self) -> bool:
        """A reused connection failed before any response byte (the server had closed it):
        send the request once more on a new connection. False when that is not allowed."""
        r = self.raw
        conn = self._conn
        if conn is None or not r.conn_reused or r.retries or r.read_end or self._finished:
            return False
        self._unregister()
        self._conn = None
        if self._pool is not None:
            self._pool.discard(conn)
            self._pool.stats.retried += 1
        else:
            conn.close()
        r.retries += 1
        r.drop_capture()
        r.mode, r.body_start, r.body_end = MODE_HEAD, -1, -1
        r.kernel_reads = r.user_reads = 0
        r.head_ns = r.sent_end_ns = 0
        r.sent_any = r.server_close = r.read_to_close = False
        r.send_clock = ClockSource.USERSPACE
        self._sent = 0
        self._tls_out = bytearray()
        self._done_seen = False
        self._open()
        return True

    def _on_writable(self) -> None:
        conn = self._conn
        assert conn is not None and self._loop is not None
        if conn.tx:
            read_tx_stamps(conn.sock, conn.tx_stamps)
        if not self.raw.connect_end_ns and not self.raw.conn_reused:
            err = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self._connect_failed(err)
                return
            self._loop.remove_writer(self._writer_fd)
            self._writer_fd = -1
            self._connected()
            return
        if conn.ssl is not None:
            self._tls_advance()
        else:
            self._send()
