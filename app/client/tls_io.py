"""HTTPS on the load generator's raw sockets: TLS through ``ssl.SSLContext.wrap_bio``
(memory BIOs), driven by the same loop callbacks as plain HTTP (``app.client.http_stream``).

Each TCP read is stamped as a plain one is, fed to the TLS object, and the plaintext it made
available (possibly none) is recorded with that read's stamp; the request's ciphertext
offsets in the connection's byte stream key its transmit stamps. ``TlsIO`` holds the TLS
half of ``StreamRequest``: the handshake, the encrypted request, the flush of ciphertext and
the TLS read callback (its state: ``app.client.stream_state``).
"""

from __future__ import annotations

import ssl
import time

from app.client.connpool import is_stale_error, read_tx_stamps
from app.client.sockets import os_error
from app.client.stream_state import StreamState
from app.domain import RequestStatus


class TlsIO(StreamState):
    """The TLS methods of ``StreamRequest``."""

    __slots__ = ()

    def _tls_advance(self) -> None:
        """Drive the handshake as far as the received bytes allow; once it is done, hand
        the request to TLS. Then send what TLS produced and make sure we read."""
        conn = self._conn
        assert conn is not None and conn.ssl is not None
        if not self._hs_done:
            try:
                conn.ssl.do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                pass  # more bytes from the server needed (memory BIOs never block writes)
            except (ssl.SSLError, ValueError) as e:  # ValueError: host name checks
                self._tls_flush(best_effort=True)  # the alert, if any, tells the server why
                self._finish(RequestStatus.ERROR, os_error("tls handshake", e), time.monotonic_ns())
                return
            else:
                self._hs_done = True
                self.raw.tls_end_ns = time.monotonic_ns()
                self._tls_write_request()
                return
        self._tls_flush()

    def _tls_write_request(self) -> None:
        """Encrypt the request after whatever handshake bytes wait to be sent; remember
        where its ciphertext starts and ends in the connection's byte stream."""
        conn = self._conn
        assert conn is not None and conn.ssl is not None and conn.out_bio is not None
        self._app_start = conn.sent + len(self._tls_out) + conn.out_bio.pending
        self.raw.t0_ns = time.monotonic_ns()
        req = memoryview(self._req_bytes)
        off = 0
        while off < len(req):  # a memory BIO takes it all; the loop is for form
            off += conn.ssl.write(req[off:])
        self._app_end = conn.sent + len(self._tls_out) + conn.out_bio.pending
        self._tls_flush()

    def _tls_flush(self, *, best_effort: bool = False) -> None:
        """Send the ciphertext TLS produced; what the socket does not take waits for
        writability. Also makes sure the socket is being read."""
        conn = self._conn
        loop = self._loop
        assert conn is not None and loop is not None and conn.out_bio is not None
        sock = conn.sock
        out = self._tls_out
        if conn.out_bio.pending:
            out += conn.out_bio.read()
        while out:
            limit = len(out)
            if conn.tx and conn.sent <= self._app_start < conn.sent + limit:
                limit = min(limit, self._app_start - conn.sent + conn.mss)
            try:
                n = sock.send(out if limit == len(out) else out[:limit])
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as e:
                if best_effort:
                    return
                if self._hs_done and is_stale_error(e.errno or 0) and self._retry():
                    return
                phase = "tls send" if self._hs_done else "tls handshake"
                self._finish(RequestStatus.ERROR, os_error(phase, e), time.monotonic_ns())
                return
            del out[:n]
            if self._hs_done and n and conn.sent + n > self._app_start:
                self.raw.sent_any = True
            conn.sent += n
            if n < limit:
                break
        if best_effort:
            return
        if self._hs_done and not self.raw.sent_end_ns and conn.sent >= self._app_end > 0:
            self.raw.sent_end_ns = time.monotonic_ns()
        if conn.tx:
            read_tx_stamps(sock, conn.tx_stamps)
        fd = sock.fileno()
        if out:
            if self._writer_fd < 0:
                self._writer_fd = fd
                loop.add_writer(fd, self._on_writable)
        elif self._writer_fd >= 0:
            loop.remove_writer(self._writer_fd)
            self._writer_fd = -1
        if self._reader_fd < 0:
            self._reader_fd = fd
            conn.watch(loop, self._on_readable_tls)

    def _on_readable_tls(self) -> None:
        """``_on_readable`` for TLS: the read's stamp goes to the plaintext it made
        available (none while handshaking, or when it only completed part of a record)."""
        t_user = time.monotonic_ns()
        rbuf = self._rbuf
        conn = self._conn
        assert conn is not None
        try:
            n, anc, _flags, _addr = conn.sock.recvmsg_into(rbuf, self._anc)
        except (BlockingIOError, InterruptedError):
            if conn.tx:
                read_tx_stamps(conn.sock, conn.tx_stamps)
            return
        except OSError as e:
            if self._hs_done and is_stale_error(e.errno or 0) and self._retry():
                return
            phase = "read" if self._hs_done else "tls handshake"
            self._finish(RequestStatus.ERROR, os_error(phase, e), t_user)
            return
        r = self.raw
        stamp = self._stamp(anc, t_user)
        if anc:
            r.kernel_reads += 1
        elif n:
            r.user_reads += 1
        else:  # TCP EOF without the server's close_notify (that one ends the read below)
            if not self._retry():
                self._tls_eof(t_user)
            return
        sslobj = conn.ssl
        assert sslobj is not None and conn.in_bio is not None
        conn.in_bio.write(rbuf[0][:n])
        if not self._hs_done:
            self._tls_advance()
            if not self._hs_done or self._finished:
                return
        parts: list[bytes] = []
        closed = False
        while True:
            try:
                data = sslobj.read(65536)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # close_notify: the server ended the session
                closed = True
                break
            except ssl.SSLError as e:
                self._tls_error("tls read failed", e, t_user)
                return
            if not data:  # close_notify
                closed = True
                break
            parts.append(data)
        if parts:
            data = parts[0] if len(parts) == 1 else b"".join(parts)
            buf = r.buf
            old = len(buf)
            buf += data
            self._took(old, len(data), stamp, t_user)
        if self._finished:
            return
        if closed:
            if not r.read_end and self._retry():
                return
            self._on_eof(stamp)
        elif conn.out_bio is not None and conn.out_bio.pending:  # e.g. a key update
            self._tls_flush()

    def _tls_eof(self, t_user: int) -> None:
        if not self._hs_done:
            self._finish(
                RequestStatus.ERROR,
                "tls handshake failed: the server closed the connection",
                t_user,
            )
            return
        self.raw.count_events = True
        self._finish(
            RequestStatus.ERROR,
            "tls: the server closed the connection without close_notify (truncated)",
            t_user,
        )

    def _tls_error(self, what: str, e: BaseException, t_ns: int) -> None:
        self.raw.count_events = True
        self._finish(RequestStatus.ERROR, f"{what}: {e.__class__.__name__}: {e}", t_ns)
