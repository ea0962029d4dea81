"""Connections the load generator keeps open, and the kernel's transmit stamps on them.

SPEC 1b: connections persist across a run's requests (HTTP/1.1 keep-alive, one per
concurrency slot) and ``t0`` is when a request's first byte leaves the client.

* ``Conn``: one TCP connection (and its TLS session, for https), with the count of bytes
  handed to the kernel since transmit stamping was turned on: transmit stamps are keyed by
  that count, so a request knows which stamp is its first byte's.
* Transmit stamps (Linux ``SO_TIMESTAMPING``): ``SOF_TIMESTAMPING_TX_SOFTWARE`` asks for the
  moment the packet holding the last byte of each ``send`` reaches the device driver;
  ``OPT_ID`` (+ ``OPT_ID_TCP``) keys it by that byte's offset in the stream, ``OPT_TSONLY``
  returns the stamp without the packet, and ``OPT_RX_FILTER`` keeps these flags from adding
  a second stamp to every receive. The stamps arrive on the socket's error queue
  (``MSG_ERRQUEUE``). The client sends a request's first segment (up to the MSS) in a send
  of its own, so the first stamp is the first byte's.
* ``ConnPool``: idle keep-alive connections (the most recently used first) and the run's
  connection counters. A connection stays registered with the event loop for reading from
  its first request to its close (``Conn.watch``): no selector registration per request.
  While it is idle, a readable event (the server closed it, or sent bytes nobody asked for)
  marks it dead; a connection never watched gets a non-blocking ``MSG_PEEK`` before reuse
  instead. Either way such a connection is dropped and the request opens a new one.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import struct
import sys
from asyncio import AbstractEventLoop
from collections.abc import Callable
from dataclasses import dataclass, field
from ssl import MemoryBIO, SSLObject

SO_TIMESTAMPING: int = getattr(socket, "SO_TIMESTAMPING", 37)
SOF_TIMESTAMPING_TX_SOFTWARE = 1 << 1
SOF_TIMESTAMPING_SOFTWARE = 1 << 4
SOF_TIMESTAMPING_OPT_ID = 1 << 7
SOF_TIMESTAMPING_OPT_TSONLY = 1 << 11
SOF_TIMESTAMPING_OPT_ID_TCP = 1 << 16
SOF_TIMESTAMPING_OPT_RX_FILTER = 1 << 17
TX_FLAGS = (
    SOF_TIMESTAMPING_TX_SOFTWARE
    | SOF_TIMESTAMPING_SOFTWARE
    | SOF_TIMESTAMPING_OPT_ID
    | SOF_TIMESTAMPING_OPT_TSONLY
)
SO_EE_ORIGIN_TIMESTAMPING = 4
SCM_TSTAMP_SND = 0
_SOL_IP = getattr(socket, "SOL_IP", 0)
_SOL_IPV6 = getattr(socket, "SOL_IPV6", 41)
_IP_RECVERR = 11
_IPV6_RECVERR = 25
_RECVERR = ((_SOL_IP, _IP_RECVERR), (_SOL_IPV6, _IPV6_RECVERR))
_SCM_TIMESTAMPING = struct.Struct("@qqqqqq")  # struct scm_timestamping: 3 timespecs
_EXTENDED_ERR = struct.Struct("=IBBBBII")  # struct sock_extended_err
ERRQUEUE_ANCBUF = 512
MSG_ERRQUEUE: int = getattr(socket, "MSG_ERRQUEUE", 0x2000)
_PEEK_NOWAIT = int(socket.MSG_PEEK | socket.MSG_DONTWAIT)  # an int: no enum work per call
DEFAULT_MSS = 1448

CONNECTION_MODES = ("keep-alive", "new")


def tx_stamps_supported() -> bool:
    return sys.platform.startswith("linux")


def enable_tx_stamps(sock: socket.socket) -> bool:
    """Turn transmit stamping on for ``sock`` (call it once connected, before any send: the
    byte counter starts at 0 there). False where the platform or kernel refuses."""
    if not tx_stamps_supported():
        return False
    extras = (
        SOF_TIMESTAMPING_OPT_ID_TCP | SOF_TIMESTAMPING_OPT_RX_FILTER,
        SOF_TIMESTAMPING_OPT_ID_TCP,
        0,
    )
    for extra in extras:
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TX_FLAGS | extra)
        except OSError:
            continue
        return True
    return False


def read_tx_stamps(sock: socket.socket, out: list[tuple[int, int]], until: int = -1) -> bool:
    """Append ``(byte key, CLOCK_REALTIME ns)`` of every transmit stamp waiting on the error
    queue to ``out``; False when the socket has failed (the queue held a real error).
    ``until`` >= 0: stop once a stamp keyed at or past it was read (the caller's last byte
    is stamped: no further read to learn that the queue is empty)."""
    while True:
        try:
            _data, anc, _flags, _addr = sock.recvmsg(0, ERRQUEUE_ANCBUF, MSG_ERRQUEUE)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        stamp = -1
        key = -1
        for level, typ, data in anc:
            if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPING:
                if len(data) >= _SCM_TIMESTAMPING.size:
                    sec, nsec = _SCM_TIMESTAMPING.unpack_from(data)[:2]
                    stamp = sec * 1_000_000_000 + nsec
            elif (level, typ) in _RECVERR and len(data) >= _EXTENDED_ERR.size:
                ee_errno, origin, _t, _c, _p, info, ee_data = _EXTENDED_ERR.unpack_from(data)
                if origin == SO_EE_ORIGIN_TIMESTAMPING and info == SCM_TSTAMP_SND:
                    key = ee_data
                elif ee_errno:
                    return False
        if stamp > 0 and key >= 0:
            out.append((key, stamp))
            if 0 <= until <= key:
                return True
        if not anc:
            return True


def raise_nofile_limit() -> int | None:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (a server or a load holds many
    sockets); returns the soft limit now (None where the OS has no such limit)."""
    try:
        import resource
    except ImportError:
        return None
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != hard and (hard == resource.RLIM_INFINITY or soft < hard):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    except (OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


def tcp_mss(sock: socket.socket) -> int:
    try:
        mss = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
    except (OSError, AttributeError):
        return DEFAULT_MSS
    return mss if mss > 0 else DEFAULT_MSS


@dataclass(slots=True, eq=False)
class Conn:
    """One open connection. ``sent`` counts bytes handed to the kernel since stamping was
    turned on (TLS: ciphertext, handshake included); transmit stamps are keyed by it."""

    id: int
    sock: socket.socket
    family: int
    tx: bool = False
    mss: int = DEFAULT_MSS
    sent: int = 0
    requests: int = 0  # responses completed on it
    tx_stamps: list[tuple[int, int]] = field(default_factory=list)  # (key, realtime ns)
    ssl: SSLObject | None = None
    in_bio: MemoryBIO | None = None
    out_bio: MemoryBIO | None = None
    key: object = None  # where it is connected (the pool keeps idle ones by it)
    loop: AbstractEventLoop | None = None  # where it is registered for reading (``watch``)
    reader: Callable[[], None] | None = None  # its request's read callback; None: idle
    dead: bool = False  # readable while idle: the server closed it or sent stray bytes

    def watch(self, loop: AbstractEventLoop, reader: Callable[[], None]) -> None:
        """Route the socket's read events to ``reader`` (its request's callback). The
        first call registers the socket with ``loop``; it stays registered until ``close``,
        so a kept-alive connection costs no selector call per request."""
        self.reader = reader
        if self.loop is None:
            self.loop = loop
            loop.add_reader(self.sock.fileno(), self._readable)

    def unwatch(self) -> None:
        """Its request is done with it: read events go to the idle check now."""
        self.reader = None

    def watch_idle(self, loop: AbstractEventLoop) -> None:
        """Registered with ``loop`` while idle, before any request used it (opened ahead):
        its read events go to the idle check."""
        if self.loop is None:
            self.loop = loop
            loop.add_reader(self.sock.fileno(), self._readable)

    def enable_tx(self) -> None:
        """Transmit stamps on, once connected (``tx`` False when the kernel refuses)."""
        self.tx = enable_tx_stamps(self.sock)
        if self.tx:
            self.mss = tcp_mss(self.sock)

    def _readable(self) -> None:
        reader = self.reader
        if reader is not None:
            reader()
            return
        if self.tx:  # a transmit stamp arrived on the error queue: keep it for its request
            read_tx_stamps(self.sock, self.tx_stamps)
        if self.closed_by_peer():
            self.dead = True
            self._unregister()

    def _unregister(self) -> None:
        loop, self.loop = self.loop, None
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(OSError, ValueError):
                loop.remove_reader(self.sock.fileno())

    def close(self) -> None:
        self.reader = None
        self._unregister()
        with contextlib.suppress(OSError):
            self.sock.close()

    def closed_by_peer(self) -> bool:
        """True when the idle connection can't be reused: the server closed it (EOF), reset
        it, or sent bytes nobody asked for (TLS: e.g. its close_notify alert)."""
        try:
            self.sock.recv(1, _PEEK_NOWAIT)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True
        return True  # EOF, or bytes nobody asked for

    def reusable(self) -> bool:
        """Not found closed: a watched connection was checked by its idle read events, one
        never watched is checked now."""
        if self.dead:
            return False
        return self.loop is not None or not self.closed_by_peer()


@dataclass(slots=True)
class ConnStats:
    """What the run's connections did (``LoadResult.connections``)."""

    mode: str = "keep-alive"
    opened: int = 0  # TCP connections opened (attempted)
    reused: int = 0  # requests sent on a connection an earlier request had used
    closed_idle: int = 0  # idle connections found closed by the server before reuse
    closed_by_server: int = 0  # responses that said ``Connection: close`` (or HTTP/1.0)
    read_to_close: int = 0  # responses framed by the server closing the connection
    retried: int = 0  # requests retried on a new connection after a reused one failed
    opened_ahead: int = 0  # of ``opened``: opened idle, ahead of a fan-out (``preconnect``)
    max_open: int = 0
    bound: int = 0  # most connections open at once the run allows

    def to_dict(self) -> dict[str, int | str]:
        return {
            "mode": self.mode,
            "opened": self.opened,
            "reused": self.reused,
            "closed_idle": self.closed_idle,
            "closed_by_server": self.closed_by_server,
            "read_to_close": self.read_to_close,
            "retried": self.retried,
            "opened_ahead": self.opened_ahead,
            "max_open": self.max_open,
            "bound": self.bound,
        }


class ConnPool:
    """Idle keep-alive connections of one run (one event loop: no locking), kept by where
    they are connected (``Conn.key``: a run of several targets takes one of its own)."""

    def __init__(self, *, keep_alive: bool, bound: int) -> None:
        self.keep_alive = keep_alive
        self.stats = ConnStats(mode="keep-alive" if keep_alive else "new", bound=bound)
        self._idle: dict[object, list[Conn]] = {}
        self._next_id = 0
        self.open = 0

    def new_id(self) -> int:
        self._next_id += 1
        self.stats.opened += 1
        self.open += 1
        self.stats.max_open = max(self.stats.max_open, self.open)
        return self._next_id

    def take(self, key: object = None) -> Conn | None:
        """An idle connection to ``key`` that is still open, or None (open a new one)."""
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.reusable():
                self.stats.closed_idle += 1
                self.discard(conn)
                continue
            return conn
        return None

    def give(self, conn: Conn) -> None:
        """A connection whose response ended cleanly: keep it for the next request."""
        if self.keep_alive:
            self._idle.setdefault(conn.key, []).append(conn)
        else:
            self.discard(conn)

    def discard(self, conn: Conn) -> None:
        conn.close()
        self.open -= 1

    def close_all(self) -> None:
        for idle in self._idle.values():
            while idle:
                self.discard(idle.pop())

    @property
    def idle(self) -> int:
        return sum(len(idle) for idle in self._idle.values())


def first_stamp_at_or_after(stamps: list[tuple[int, int]], key: int) -> int | None:
    """The stamp of the send that carried byte ``key``: the smallest stamped key >= ``key``
    (each send is stamped at its last byte)."""
    best_key = -1
    best = None
    for k, t in stamps:
        if k >= key and (best_key < 0 or k < best_key):
            best_key, best = k, t
    return best


def is_stale_error(err: int) -> bool:
    """Errors of a reused connection the server had closed (safe to retry: nothing read)."""
    return err in (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED, errno.ENOTCONN)
