"""Kernel receive stamps on the simulator's side: ``StampSocket`` (reads note the kernel's
``SO_TIMESTAMPNS`` stamp of the data they returned; sends note the time right before the
syscall), the listening socket whose accepted sockets are ``StampSocket``s
(``listen_socket``), and ``clock_offset`` (``CLOCK_REALTIME - CLOCK_MONOTONIC``), which puts
a kernel stamp on the monotonic clock the ground truth is kept in.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from time import monotonic_ns
from typing import Any

SO_TIMESTAMPNS: int = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("@qq")
_RX_ANCBUF = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0


class StampSocket(socket.socket):
    """A socket whose reads note the kernel's receive stamp (``SO_TIMESTAMPNS``) of the data
    they returned: asyncio's transports read through ``recv`` / ``recv_into``, and the
    listening socket's ``accept`` hands out sockets of this class."""

    __slots__ = ("rx_real_ns", "send_ns", "stamp_rx")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rx_real_ns = 0  # CLOCK_REALTIME stamp of the last read's data (0: none)
        self.send_ns = 0  # monotonic time right before the last send call (TLS: encrypted)
        self.stamp_rx = False  # (listening socket) turn stamps on for accepted sockets

    def send(self, data: Any, flags: int = 0) -> int:
        self.send_ns = monotonic_ns()
        return super().send(data, flags)

    def accept(self) -> tuple[socket.socket, Any]:
        """Accepted sockets stamp from their first read on: a TLS connection's first request
        arrives with the handshake's last flight, before the protocol sees the connection."""
        fd, addr = self._accept()  # type: ignore[attr-defined]
        sock = StampSocket(self.family, self.type, self.proto, fileno=fd)
        if socket.getdefaulttimeout() is None and self.gettimeout():
            sock.setblocking(True)
        if self.stamp_rx:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return sock, addr

    def _note(self, anc: list[tuple[int, int, bytes]]) -> None:
        for level, typ, cdata in anc:
            if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS:
                sec, nsec = _TIMESPEC.unpack_from(cdata)
                self.rx_real_ns = sec * 1_000_000_000 + nsec

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data, anc, _f, _a = self.recvmsg(bufsize, _RX_ANCBUF, flags)
        self._note(anc)
        return data

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        mv = memoryview(buffer).cast("B")
        n, anc, _f, _a = self.recvmsg_into([mv[:nbytes] if nbytes else mv], _RX_ANCBUF, flags)
        self._note(anc)
        return n


def clock_offset() -> int:
    """``CLOCK_REALTIME - CLOCK_MONOTONIC`` in ns, from the tightest of a few reads."""
    best_gap, offset = -1, 0
    for _ in range(7):
        a = time.monotonic_ns()
        r = time.time_ns()
        b = time.monotonic_ns()
        if best_gap < 0 or b - a < best_gap:
            best_gap, offset = b - a, r - (a + b) // 2
    return offset


def listen_socket(host: str, port: int, stamps: bool = True) -> StampSocket:
    """The listening socket (with ``stamps``, its accepted sockets stamp what they read)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    if not infos:
        raise OSError(f"cannot resolve {host}")
    family, stype, proto, _canon, addr = infos[0]
    sock = StampSocket(family, stype, proto)
    sock.stamp_rx = stamps
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
        sock.listen(4096)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
