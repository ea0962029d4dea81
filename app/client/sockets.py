"""Socket helpers of the load generator: a failure's error text, growing the process's
file-descriptor table ahead of a burst of connects, and resolving a target once a run."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

from app.client.clocks import SO_TIMESTAMPNS
from app.client.http_request import Target


def os_error(phase: str, e: BaseException) -> str:
    """A socket or TLS failure as a run's error text: the phase and what failed."""
    if isinstance(e, ConnectionRefusedError):
        return f"connection refused ({phase})"
    if isinstance(e, ConnectionResetError):
        return f"connection reset by peer ({phase})"
    return f"{phase} failed: {e.__class__.__name__}: {e}"


def stream_socket(family: int, kernel: bool) -> tuple[socket.socket, bool]:
    """A non-blocking stream socket with the run's options: receive stamps when ``kernel``
    (False back when the kernel refused them), ``TCP_NODELAY`` on TCP."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    if kernel:
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            kernel = False
    if family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock, kernel


def reserve_fds(n: int) -> None:
    """Grow the process's file-descriptor table now so it holds ``n`` more sockets.

    The kernel grows it by doubling when a new fd does not fit; in a process with threads
    (asyncio's resolver pool) that waits for an RCU grace period inside ``socket()``:
    10-20 ms, once per doubling, in the middle of a burst of request starts.
    """
    try:
        import fcntl
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        fd = os.open(os.devnull, os.O_RDONLY)
    except (ImportError, OSError, ValueError):
        return
    try:
        want = min(soft - 1, fd + n + 32) if soft > 0 else fd + n + 32
        if want > fd:
            high = fcntl.fcntl(fd, fcntl.F_DUPFD, want)  # lowest free fd >= want: no clobbering
            os.close(high)
    except OSError:
        pass
    finally:
        os.close(fd)


async def resolve(target: Target) -> tuple[int, tuple[Any, ...]]:
    """Resolve the target once: ``(family, sockaddr)``."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"cannot resolve {target.host}")
    family, _type, _proto, _canon, sockaddr = infos[0]
    return int(family), tuple(sockaddr)
