"""The client's clocks: kernel receive stamps (``SO_TIMESTAMPNS``) mapped onto the monotonic
clock (``ClockMap``), and the process-wide switch that keeps the kernel stamping
(``keep_kernel_stamps_on``). ``app.client.http_stream`` stamps every read with them.
"""

from __future__ import annotations

import socket
import struct
import sys
import time
from dataclasses import dataclass, field

SO_TIMESTAMPNS: int = getattr(socket, "SO_TIMESTAMPNS", 35)
SCM_TIMESTAMPNS: int = getattr(socket, "SCM_TIMESTAMPNS", SO_TIMESTAMPNS)
TIMESPEC = struct.Struct("@qq")  # struct timespec on 64-bit Linux
ANCBUF = socket.CMSG_SPACE(TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0


def sample_clock_offset(tries: int = 7) -> int:
    """``CLOCK_REALTIME - CLOCK_MONOTONIC`` in ns, from the tightest of a few bracketed reads."""
    best_gap = -1
    offset = 0
    for _ in range(tries):
        a = time.monotonic_ns()
        r = time.time_ns()
        b = time.monotonic_ns()
        if best_gap < 0 or b - a < best_gap:
            best_gap = b - a
            offset = r - (a + b) // 2
    return offset


@dataclass(slots=True)
class ClockMap:
    """Maps kernel ``CLOCK_REALTIME`` stamps onto ``time.monotonic_ns()``.

    ``offset_ns`` is the current ``realtime - monotonic``; ``resample()`` updates it and
    tracks how far it moved since the first sample (``max_drift_ns``).
    """

    offset_ns: int = field(default_factory=sample_clock_offset)
    initial_offset_ns: int = 0
    max_drift_ns: int = 0
    samples: int = 1

    def __post_init__(self) -> None:
        self.initial_offset_ns = self.offset_ns
        keep_kernel_stamps_on()

    def resample(self) -> int:
        self.offset_ns = sample_clock_offset()
        self.samples += 1
        drift = abs(self.offset_ns - self.initial_offset_ns)
        self.max_drift_ns = max(self.max_drift_ns, drift)
        return self.offset_ns

    def to_monotonic(self, realtime_ns: int) -> int:
        return realtime_ns - self.offset_ns


def kernel_stamps_supported() -> bool:
    return sys.platform.startswith("linux") and ANCBUF > 0


_stamp_keeper: socket.socket | None = None


def keep_kernel_stamps_on() -> None:
    """Hold one socket with ``SO_TIMESTAMPNS`` open for the process's lifetime.

    Linux turns receive timestamping on system-wide only while some socket wants it, and it
    does so asynchronously (a deferred static-key switch): the first segments a fresh socket
    receives right after ``setsockopt`` can come without a stamp. Turning it on early (at
    clock setup, before any request), waiting until a datagram to itself comes back stamped
    (at most ~0.5 s), and keeping it on avoids that race.
    """
    global _stamp_keeper
    if _stamp_keeper is not None or not kernel_stamps_supported():
        return
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        s.bind(("127.0.0.1", 0))
        s.settimeout(0.05)
        deadline = time.monotonic() + 0.5
        while True:
            s.sendto(b"t", s.getsockname())
            _data, anc, _flags, _addr = s.recvmsg(16, ANCBUF)
            if any(lvl == socket.SOL_SOCKET and typ == SCM_TIMESTAMPNS for lvl, typ, _ in anc):
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(0.002)  # the switch is done by a kernel worker: give it time
    except OSError:
        return
    _stamp_keeper = s
