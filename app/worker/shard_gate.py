"""The common start of a run dealt over workers, on a shard's worker (docs/scale.md).

Once its share is built, the shard's load calls ``start_at("run")``: the worker tells the
server it is ready (``POST /jobs/{id}/shard-ready``) and asks again until the answer carries
the start instant, on the server's wall clock, which the server gives once every shard is
leased and ready. With warm-ups, ``start_at("measure")`` does the same once the shard's
warm-ups ended (phase "measure"): every shard's measured phase starts at one instant, after
every shard's warm-ups. ``instant`` is the same without the wait (a shard run over the
worker's load processes hands it to them: ``app.client.shards.coordinator``).
Each call is also a four-timestamp exchange (as a heartbeat's), so the
offset to the server is measured many times just before the start. The instant is mapped
onto this host's ``CLOCK_MONOTONIC`` through the offset with the smallest round trip
(``monotonic_target``); the load sleeps, then spins, until it, and records how late it woke.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from app.client.shards.worker_share import ShardFigures, cpu_s
from app.protocol.clock_sync import Exchange, OffsetTracker
from app.protocol.wire import LeasedJob, ShardReady
from app.worker.client import ServerUnreachable, WorkerClient

READY_POLL_S = 0.02  # between "ready" calls while the other shards are not
SYNC_POLL_S = 0.005  # between exchanges once the start is known, until SYNC_STOP_NS before it
SYNC_STOP_NS = 60_000_000
SPIN_NS = 1_500_000  # the last stretch before the start is spun, not slept


def monotonic_target(start_server_ns: int, offset_ns: int, wall_ns: int, mono_ns: int) -> int:
    """The server's wall instant ``start_server_ns`` on this host's monotonic clock, given
    ``offset_ns`` (server minus this host) and one reading of both clocks here."""
    return mono_ns + (start_server_ns - offset_ns - wall_ns)


class ShardGate:
    """``StartGate`` of a shard: ``start_at`` runs on the load's loop, the calls to the
    server on the worker's (``loop``)."""

    def __init__(
        self,
        client: WorkerClient,
        job: LeasedJob,
        clock: OffsetTracker,
        figures: ShardFigures,
        loop: asyncio.AbstractEventLoop,
        stopped: Callable[[], bool],
    ) -> None:
        self.client = client
        self.job = job
        self.clock = clock
        self.figures = figures
        self.loop = loop
        self.stopped = stopped
        self.waiting: tuple[int, int, int] | None = None  # leased, ready, shards

    async def instant(self, phase: str) -> int:
        """The common instant of ``phase`` ("run": the start; "measure": the measured
        phase's, after every shard's warm-ups) on this host's monotonic clock, without
        waiting for it; a stop while the measured start is awaited answers now."""
        if phase == "run":
            self.figures.cpu_ready_s = cpu_s()
        fut = asyncio.run_coroutine_threadsafe(self._start_ns(phase), self.loop)
        start_ns = await asyncio.wrap_future(fut)
        if start_ns is None:
            return time.monotonic_ns()
        est = self.clock.estimate()
        return monotonic_target(
            start_ns, est.offset_ns if est else 0, time.time_ns(), time.monotonic_ns()
        )

    async def start_at(self, phase: str) -> int:
        t = await self.instant(phase)
        now = time.monotonic_ns()
        if t - now > SPIN_NS:
            await asyncio.sleep((t - now - SPIN_NS) / 1e9)
        while time.monotonic_ns() < t:
            pass
        self.figures.wake_ns[phase] = time.monotonic_ns() - t
        return t

    async def _start_ns(self, phase: str) -> int | None:
        which = "measure" if phase == "measure" else "run"
        body = ShardReady(lease_id=self.job.lease_id, phase=which)
        while True:
            if self.stopped():
                if phase == "measure":  # the load stops: its warm-ups' records are kept
                    return None
                raise RuntimeError("stopped before every shard was ready")
            t1 = time.time_ns()
            try:
                resp = await self.client.shard_ready(self.job.job_id, body)
            except ServerUnreachable:
                await asyncio.sleep(READY_POLL_S * 10)
                continue
            t4 = time.time_ns()
            if resp.clock_t2_ns is not None and resp.clock_t3_ns is not None:
                self.clock.add(Exchange(t1, resp.clock_t2_ns, resp.clock_t3_ns, t4))
            self.waiting = (resp.leased, resp.ready, resp.shards)
            if resp.start_ns is not None:
                await self._exchange_until(resp.start_ns - SYNC_STOP_NS, body)
                return resp.start_ns
            await asyncio.sleep(READY_POLL_S)

    async def _exchange_until(self, until_server_ns: int, body: ShardReady) -> None:
        """More clock exchanges while the start approaches: the smallest round trip of
        more samples is a tighter bound on the offset that maps the start."""
        while True:
            est = self.clock.estimate()
            if time.time_ns() + (est.offset_ns if est else 0) >= until_server_ns:
                return
            t1 = time.time_ns()
            try:
                resp = await self.client.shard_ready(self.job.job_id, body)
            except ServerUnreachable:
                return
            t4 = time.time_ns()
            if resp.clock_t2_ns is not None and resp.clock_t3_ns is not None:
                self.clock.add(Exchange(t1, resp.clock_t2_ns, resp.clock_t3_ns, t4))
            await asyncio.sleep(SYNC_POLL_S)
