"""The worker's pull loop: register, re-send what an earlier process left spooled, then ask
for a lease every ``poll_interval_s`` and run each leased job (``app.worker.job``).

When the server is unreachable, registering and polling retry with capped exponential
backoff and jitter; a job already running goes on (its batches wait in the spool). A 401/403
ends the loop with ``AuthError``: retrying a bad token helps nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx

from app.protocol.wire import (
    JobKind,
    LeasedJob,
    RegisterRequest,
    RegisterResponse,
    WorkerCapabilities,
)
from app.worker.backoff import Backoff, sleep_or_stop
from app.worker.capabilities import collect
from app.worker.client import (
    AuthError,
    NotFound,
    ProtocolError,
    ServerUnreachable,
    WorkerClient,
)
from app.worker.job import JobOptions, JobOutcome, JobRun
from app.worker.kinds import runner_of
from app.worker.processes import Processes
from app.worker.spool import Spool, StateDirLock, default_state_root, worker_key
from app.worker.uploader import Uploader

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    backoff_initial_s: float = 0.25
    backoff_max_s: float = 15.0
    http_timeout_s: float = 30.0
    batch_interval_s: float = 1.0
    batch_max_requests: int = 256
    shutdown_grace_s: float = 10.0
    kernel_stamps: bool = True
    realtime: bool = False  # run loads at real-time priority (app.client.sched)
    # where a run's dataset_path may point (app.client.datasets.open_dataset); empty: nowhere
    dataset_dirs: tuple[str, ...] = ()
    allow_link_local: bool = False  # targets resolving to 169.254/16, fe80::/10 (metadata)
    processes: Processes | None = None  # a run asking for one process gets these (--processes)
    heartbeat_interval_s: float | None = None  # None: what the server asks for
    poll_interval_s: float | None = None  # None: what the server asks for


async def until_stopped(aw: Awaitable[T], stop: asyncio.Event) -> tuple[bool, T | None]:
    """Await ``aw`` unless ``stop`` is set first (then ``aw`` is cancelled): (done, value)."""
    task = asyncio.ensure_future(aw)
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return False, None
    return True, task.result()


class Worker:
    def __init__(
        self,
        server_url: str,
        token: str,
        *,
        labels: dict[str, str] | None = None,
        state_dir: Path | None = None,
        kinds: Sequence[JobKind] = ("bench", "sweep"),
        name: str | None = None,
        options: WorkerOptions | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.server_url = server_url.rstrip("/")
        self.token = token
        self.labels = dict(labels or {})
        self.state_dir = state_dir
        self.kinds: list[JobKind] = list(kinds)
        self.name = name or socket.gethostname()
        self.opts = options or WorkerOptions()
        self._transport = transport
        self.worker_id: str | None = None
        self.registration: RegisterResponse | None = None
        self.capabilities: WorkerCapabilities | None = None
        self.outcomes: list[JobOutcome] = []  # jobs this instance finished, in order
        self._client: WorkerClient | None = None
        self._spool: Spool | None = None

    # ---- public entry points

    async def run_forever(self, stop: asyncio.Event | None = None) -> None:
        """Serve jobs until ``stop`` is set (a running job then ends within the grace)."""
        stop = stop or asyncio.Event()
        async with self._session():
            if not await self._register(stop):
                return
            await self._recover(stop)
            backoff = self._backoff()
            while not stop.is_set():
                try:
                    ran = await self._poll_and_run(stop)
                except (ServerUnreachable, ProtocolError) as e:
                    delay = backoff.next()
                    log.warning("cannot get work (%s); retry in %.1fs", e, delay)
                    await sleep_or_stop(stop, delay)
                    continue
                except NotFound:
                    log.warning("the server does not know this worker; registering again")
                    if not await self._register(stop):
                        return
                    continue
                except AuthError:
                    raise  # the token was revoked: nothing to retry
                except Exception as e:  # e.g. the spool's disk is full or out of descriptors
                    delay = backoff.next()
                    log.exception("job handling failed (%s); going on in %.1fs", e, delay)
                    await sleep_or_stop(stop, delay)
                    continue
                backoff.reset()
                if not ran:
                    await sleep_or_stop(stop, self._poll_interval())

    async def run_once(self, stop: asyncio.Event | None = None) -> JobOutcome | None:
        """Register, re-send leftovers, ask for one job and run it; None when there was none.

        Raises ``ServerUnreachable`` when the lease request fails (registering retries)."""
        stop = stop or asyncio.Event()
        async with self._session():
            if not await self._register(stop):
                return None
            await self._recover(stop)
            before = len(self.outcomes)
            await self._poll_and_run(stop)
            return self.outcomes[-1] if len(self.outcomes) > before else None

    # ---- internals

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[None]:
        if self.state_dir is not None:
            lock = StateDirLock.acquire(self.state_dir, "", exact=True)
        else:
            lock = StateDirLock.acquire(
                default_state_root(), worker_key(self.server_url, self.name)
            )
        client = WorkerClient(
            self.server_url,
            self.token,
            timeout_s=self.opts.http_timeout_s,
            transport=self._transport,
        )
        self._client, self._spool = client, Spool(lock.path)
        log.info("worker state in %s", lock.path)
        try:
            yield
        finally:
            self._client = self._spool = None
            await client.aclose()
            lock.release()

    def _backoff(self) -> Backoff:
        return Backoff(self.opts.backoff_initial_s, self.opts.backoff_max_s)

    def _poll_interval(self) -> float:
        if self.opts.poll_interval_s is not None:
            return self.opts.poll_interval_s
        return self.registration.poll_interval_s if self.registration else 1.0

    def _job_options(self) -> JobOptions:
        reg = self.registration
        hb = self.opts.heartbeat_interval_s
        if hb is None:
            hb = min(reg.heartbeat_interval_s, reg.lease_ttl_s / 3) if reg else 5.0
        return JobOptions(
            heartbeat_interval_s=hb,
            batch_interval_s=self.opts.batch_interval_s,
            batch_max_requests=self.opts.batch_max_requests,
            backoff_initial_s=self.opts.backoff_initial_s,
            backoff_max_s=self.opts.backoff_max_s,
            shutdown_grace_s=self.opts.shutdown_grace_s,
            kernel_stamps=self.opts.kernel_stamps,
            realtime=self.opts.realtime,
            dataset_dirs=self.opts.dataset_dirs,
            allow_link_local=self.opts.allow_link_local,
            processes=self.opts.processes,
        )

    async def _register(self, stop: asyncio.Event) -> bool:
        """Register, retrying with backoff while the server is unreachable; False when
        stopped first. ``AuthError`` propagates."""
        assert self._client is not None
        if self.capabilities is None:
            self.capabilities = await asyncio.to_thread(collect, self.labels)
        req = RegisterRequest(name=self.name, capabilities=self.capabilities)
        backoff = self._backoff()
        while not stop.is_set():
            try:
                self.registration = await self._client.register(req)
            except (ServerUnreachable, ProtocolError) as e:
                delay = backoff.next()
                log.warning(
                    "cannot register with %s (%s); retry in %.1fs", self.server_url, e, delay
                )
                await sleep_or_stop(stop, delay)
                continue
            self.worker_id = self.registration.worker_id
            log.info("registered with %s as worker %s", self.server_url, self.worker_id)
            return True
        return False

    async def _poll_and_run(self, stop: asyncio.Event) -> bool:
        """Ask for one lease and run the job; False when there was no work."""
        assert self._client is not None and self.worker_id is not None
        job = await self._client.lease(self.worker_id, self.kinds)
        if job is None:
            return False
        self.outcomes.append(await self.execute(job, stop))
        return True

    async def execute(self, job: LeasedJob, stop: asyncio.Event) -> JobOutcome:
        assert self._client is not None and self._spool is not None
        log.info(
            "job %s leased (kind %s, run %s, attempt %d)",
            job.job_id,
            job.kind,
            job.run_id,
            job.attempt,
        )
        spool = await asyncio.to_thread(self._spool.open_job, job)
        run = JobRun(self._client, spool, self._job_options(), stop)
        return await run.run(runner_of(job.kind))

    async def _recover(self, stop: asyncio.Event) -> None:
        """Re-send batches (and the completion) an earlier worker process left spooled.

        A job whose lease is gone (409/404) ends here: the server already requeued it or
        kept what had arrived; batches it never got are kept (``JobSpool.keep``). A batch
        the server refuses completes the job as failed (when the earlier process had ended
        its load) and is kept too. A job that was left mid-run is not completed here; its
        lease expires on the server, which then keeps what arrived (the run is partial)."""
        assert self._client is not None and self._spool is not None
        for spool in await asyncio.to_thread(self._spool.leftovers):
            job = spool.job
            up = Uploader(self._client, spool, self._backoff())
            log.info("job %s: re-sending %d spooled batches", job.job_id, len(up.unacked))
            up.start()
            try:
                done, _ok = await until_stopped(up.drain(), stop)
                if not done:
                    return  # stopped: keep the spool for next time
                req = spool.read_complete()
                if req is not None and up.lost is None:
                    req = up.refused_request(req)
                    done, resp = await until_stopped(up.complete(req), stop)
                    if not done:
                        return
                    if resp is not None:
                        log.info("job %s: completed as %s after restart", job.job_id, req.status)
            finally:
                await up.close()
            if spool.pending():
                refused = up.refused.text(spool.kept_path()) if up.refused else None
                why = up.lost or refused or "not completed"
                kept = await asyncio.to_thread(spool.keep, why)
                log.error("job %s: %s; unsent batches kept at %s", job.job_id, why, kept)
            else:
                await asyncio.to_thread(spool.remove)
