"""Connections opened ahead of the requests that will need them: an agent trace's request
with several children (subagents fanning out) opens, as it is sent, one idle keep-alive
connection per child beyond the first (which takes the parent's own connection), so that
where its reply ends every child is sent at once on an open connection, not after a
connect. Each one is opened in the background and given to the run's pool
(``ConnPool.give``), counted in ``ConnStats.opened_ahead``; one that fails is dropped (a
request then opens its own, and reports a failure as usual)."""

from __future__ import annotations

import asyncio
from functools import partial

from app.client.clocks import kernel_stamps_supported
from app.client.connpool import Conn, ConnPool, tx_stamps_supported
from app.client.sockets import stream_socket

__all__ = ["Opener", "open_ahead"]


class Opener:
    """A run's connections being opened ahead, in the background, into its ``pool``."""

    def __init__(self, pool: ConnPool, *, kernel_stamps: bool, timeout_s: float) -> None:
        self.pool = pool
        self.kernel = kernel_stamps and kernel_stamps_supported()
        self.tx = self.kernel and tx_stamps_supported()
        self.timeout_s = timeout_s
        self.tasks: set[asyncio.Task[int]] = set()
        self.pending = 0  # connections asked for and not yet open or given up

    def open(self, addr: tuple[object, ...], family: int, n: int) -> None:
        """Start opening ``n`` connections to ``addr`` (keep-alive pools only)."""
        if n <= 0 or not self.pool.keep_alive:
            return
        self.pending += n
        task = asyncio.create_task(
            open_ahead(
                self.pool, addr, family, n, kernel=self.kernel, tx=self.tx, timeout_s=self.timeout_s
            )
        )
        self.tasks.add(task)
        task.add_done_callback(partial(self._done, n))

    def _done(self, n: int, task: asyncio.Task[int]) -> None:
        self.pending -= n
        self.tasks.discard(task)

    async def close(self) -> None:
        """The run is over: connections still being opened are abandoned (closed)."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def open_ahead(
    pool: ConnPool,
    addr: tuple[object, ...],
    family: int,
    n: int,
    *,
    kernel: bool,
    tx: bool,
    timeout_s: float,
) -> int:
    """Open ``n`` connections to ``addr`` and leave them idle in ``pool``; how many were."""
    results = await asyncio.gather(
        *(_open_one(pool, addr, family, kernel, tx, timeout_s) for _ in range(n))
    )
    return sum(results)


async def _open_one(
    pool: ConnPool,
    addr: tuple[object, ...],
    family: int,
    kernel: bool,
    tx: bool,
    timeout_s: float,
) -> bool:
    try:
        sock, _ = stream_socket(family, kernel)
    except OSError:
        return False
    conn = Conn(pool.new_id(), sock, family, key=addr)
    loop = asyncio.get_running_loop()
    try:
        await asyncio.wait_for(loop.sock_connect(sock, addr), timeout_s)
    except (OSError, TimeoutError):
        pool.discard(conn)
        return False
    except BaseException:  # cancelled with the run: nothing left open
        pool.discard(conn)
        raise
    if tx:
        conn.enable_tx()
    conn.watch_idle(loop)
    pool.stats.opened_ahead += 1
    pool.give(conn)
    return True
