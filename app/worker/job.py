"""Execute one leased bench job: run the load, heartbeat, upload as requests finish, complete.

- A heartbeat every ``heartbeat_interval_s`` renews the lease and carries the latest progress.
  ``cancel`` in its answer stops the load cleanly: what was measured is uploaded and the job
  completes as ``cancelled``. A 409 (lease lost) stops the load and drops the job: nothing
  more is uploaded, nothing is completed.
- Finished records are cut into numbered batches every ``batch_interval_s`` or
  ``batch_max_requests`` records, spooled, and sent by the ``Uploader``.
- When the worker itself is stopped, the load stops and the job completes as ``cancelled``
  within ``shutdown_grace_s``; what could not be sent by then stays spooled for next time.
- A batch the server keeps refusing stops the load; the job completes as ``failed`` with
  the server's reason and the batches it did not take stay in the spool, kept
  (``JobSpool.keep``). A job lost with batches unsent keeps them the same way: a worker
  never deletes a batch the server did not acknowledge.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from app.client.execute import outcome_status
from app.client.metrics_scraper import LiveSource
from app.client.runner import LoadResult, Progress
from app.client.spec import RunSpec
from app.domain import RequestRecord, RequestStatus, RunStatus
from app.protocol.clock_sync import Exchange, OffsetTracker
from app.protocol.wire import (
    CompleteRequest,
    HeartbeatRequest,
    JobProgress,
    LeasedJob,
    RunMeta,
    ServerMetricSeries,
)
from app.worker.backoff import Backoff
from app.worker.client import (
    AuthError,
    LeaseLost,
    NotFound,
    ProtocolError,
    ServerUnreachable,
    WorkerClient,
)
from app.worker.device_telemetry import job_telemetry
from app.worker.load_thread import LoadThread
from app.worker.spool import JobSpool
from app.worker.uploader import Uploader

log = logging.getLogger(__name__)

CompleteStatus = Literal["succeeded", "failed", "cancelled"]
CUT_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class JobOptions:
    heartbeat_interval_s: float = 5.0
    batch_interval_s: float = 1.0
    batch_max_requests: int = 256
    backoff_initial_s: float = 0.25
    backoff_max_s: float = 10.0
    shutdown_grace_s: float = 10.0
    kernel_stamps: bool = True
    realtime: bool = False
    dataset_dirs: tuple[str, ...] = ()
    allow_link_local: bool = False
    processes: int | Literal["auto"] | None = None  # worker --processes (app.worker.processes)


@dataclass(frozen=True, slots=True)
class JobOutcome:
    job_id: str
    status: CompleteStatus | None  # None: dropped (lease lost) or left spooled (shutdown)
    detail: str | None = None


def job_progress(p: Progress | None) -> JobProgress:
    if p is None:
        return JobProgress()
    return JobProgress(
        phase=p.phase,
        planned=p.planned,
        sent=p.sent,
        done=p.done,
        errors=p.errors,
        in_flight=p.in_flight,
        output_tokens=p.output_tokens,
        tokens_per_s=p.tokens_per_s,
        elapsed_s=p.elapsed_s,
    )


def spec_from_job(data: dict[str, Any]) -> RunSpec:
    """The job's RunSpec. JSON has no infinity: an unlimited ``request_rate`` (the default)
    arrives as null (how pydantic writes inf) or absent."""
    data = dict(data)
    if data.get("request_rate") is None:
        data.pop("request_rate", None)
    return RunSpec.model_validate(data)


def failure_reason(result: LoadResult) -> str:
    measured = [r for r in result.records if not r.warmup]
    first = next((r.error for r in measured if r.status is not RequestStatus.OK and r.error), None)
    msg = f"no measured request succeeded ({len(measured)} finished)"
    return f"{msg}; first error: {first}" if first else msg


class WorkerJobKind(Protocol):
    """A job kind on the worker: run a leased job of that kind to its outcome."""

    def __call__(self, jr: JobRun) -> Awaitable[JobOutcome]: ...


class JobRun:
    """A leased job's shared machinery: its spool, uploader and heartbeats, the records a
    load hands over and their batches, and completion."""

    def __init__(
        self,
        client: WorkerClient,
        spool: JobSpool,
        options: JobOptions,
        worker_stop: asyncio.Event,
    ) -> None:
        self.client = client
        self.spool = spool
        self.job: LeasedJob = spool.job
        self.opts = options
        self.worker_stop = worker_stop
        self.uploader = Uploader(
            client, spool, Backoff(options.backoff_initial_s, options.backoff_max_s)
        )
        self.uploader.on_refused = self.stop_load  # no use measuring what can't be stored
        self.records: deque[RequestRecord] = deque()  # appended by the load thread
        # one cut at a time: records taken are numbered and spooled before the next cut, and
        # ``cut_all`` (the completion's) waits for a cut still being spooled
        self._cutting = asyncio.Lock()
        self.progress: Progress | None = None  # replaced by the load thread
        self.cancelled = False
        self.stopping = False
        self.deadline: float | None = None
        self.load: LoadThread | None = None
        self.load_note: str | None = None  # said in the run's notes (worker --processes)
        self.server_series: list[ServerMetricSeries] | None = None  # sent with the completion
        self.step_run: str | None = None  # sweeps: the current step's run (batches name it)
        self.step_info: tuple[int, int] | None = None  # sweeps: (step, of how many)
        self.scraper: LiveSource | None = None  # the targets' /metrics, while loading
        self.scraper_t0_ns = 0
        self.clock = OffsetTracker()  # this worker's clock offset to the server's
        self.completing = False  # the completion was sent (answers may still be due)

    # ---- callbacks from the load thread (cheap, thread-safe)

    def on_record(self, rec: RequestRecord) -> None:
        self.records.append(rec)

    def on_progress(self, p: Progress) -> None:
        self.progress = p

    def on_scraper(self, scraper: LiveSource) -> None:
        """The load's /metrics scraper: its latest values go out with each heartbeat."""
        self.scraper = scraper
        self.scraper_t0_ns = time.monotonic_ns()

    def stop_load(self) -> None:
        if self.load is not None:
            self.load.stop()

    # ---- main

    async def run(self, kind: WorkerJobKind) -> JobOutcome:
        """Run the job as its kind does (``app.worker.kinds``), with the uploader and the
        device telemetry every job gets."""
        self.uploader.start()
        try:
            async with job_telemetry(self.client, self.job):
                return await kind(self)
        finally:
            await self.uploader.close()

    async def load_result(self) -> LoadResult:
        """Start the load thread and wait for its result."""
        assert self.load is not None
        self.load.start()
        result = await self.load.result()
        if self.load_note is not None:
            result.notes.append(self.load_note)
        return result

    def final_status(
        self, result: LoadResult | None, error: str | None
    ) -> tuple[CompleteStatus, str | None]:
        if self.cancelled:
            return "cancelled", None
        if self.stopping:
            return "cancelled", "the worker was stopped during the run"
        if result is None:
            return "failed", error
        # the server decides "partial" for an error rate over the bound (from the stored
        # requests, by the same rule); here only a stop or no success at all matters
        if result.stopped == "stopped":
            return "cancelled", "the run was stopped"
        if outcome_status(result) is RunStatus.FAILED:
            return "failed", failure_reason(result)
        return "succeeded", None

    async def complete(
        self,
        status: CompleteStatus,
        error: str | None,
        meta: RunMeta | None = None,
        stop_reason: str | None = None,
    ) -> JobOutcome:
        job, up = self.job, self.uploader
        est = self.clock.estimate()
        if meta is not None and est is not None:  # the offset and its bound, with the run
            meta.load_stats["clock_sync"] = est.as_dict()
        req = up.refused_request(
            CompleteRequest(
                lease_id=job.lease_id,
                status=status,
                error=error,
                total_batches=up.sent_batches(),
                run_meta=meta,
                server_metrics=self.server_series,
                records=sum(up.recorded.values()),
                stop_reason=stop_reason,
            )
        )
        # spooled first: a worker restarted before the server answered still completes it
        await asyncio.to_thread(self.spool.write_complete, req)
        if not await up.drain(self.deadline):
            if up.refused is None:
                return self.give_up()
            req = up.refused_request(req)  # refused while draining: say so, declare fewer
            await asyncio.to_thread(self.spool.write_complete, req)
        self.completing = True  # a heartbeat's 409 from now on may be this completion's doing
        resp = await up.complete(req, self.deadline)
        if resp is None:
            return self.give_up()
        if up.refused is not None:
            kept = await asyncio.to_thread(self.spool.keep, req.error or "refused")
            log.error("job %s: failed: %s (spool kept at %s)", job.job_id, req.error, kept)
            return JobOutcome(job.job_id, "failed", req.error)
        await asyncio.to_thread(self.spool.remove)
        log.info(
            "job %s: %s (%d batches, %d requests stored)%s",
            job.job_id,
            req.status,
            req.total_batches,
            up.accepted,
            f": {req.error}" if req.error else "",
        )
        return JobOutcome(job.job_id, req.status, req.error)

    def give_up(self) -> JobOutcome:
        if self.uploader.lost is not None or self.uploader.refused is not None:
            return self.drop(self.uploader.lost or "the server refused a batch")
        log.warning("job %s: not completed before shutdown; results stay spooled", self.job.job_id)
        return JobOutcome(self.job.job_id, None, "left spooled at shutdown")

    def drop(self, reason: str) -> JobOutcome:
        """Nothing more is sent for this job: its spool is removed when the server has
        everything in it, else kept (``JobSpool.keep``) with ``reason``."""
        if self.spool.pending():
            kept = self.spool.keep(reason)
            log.error("job %s: %s; unsent batches kept at %s", self.job.job_id, reason, kept)
            return JobOutcome(self.job.job_id, None, f"{reason} (unsent batches kept at {kept})")
        self.spool.remove()
        return JobOutcome(self.job.job_id, None, reason)

    # ---- side tasks

    def progress_now(self) -> JobProgress:
        p = job_progress(self.progress)
        if self.step_info is not None:
            p.step, p.steps = self.step_info
            p.run_id = self.step_run
            p.phase = f"step {p.step + 1} of {p.steps}: {p.phase}"
        latest = self.scraper.latest() if self.scraper is not None else None
        if latest is not None and latest[1]:
            p.server_metrics = dict(latest[1])
            p.server_metrics_t_s = max(0.0, (latest[0] - self.scraper_t0_ns) / 1e9)
        return p

    async def cut(self) -> None:
        async with self._cutting:
            await self._cut()

    async def _cut(self) -> None:
        n = min(len(self.records), self.opts.batch_max_requests)
        if n:  # spooled even when the job is lost or refused: kept, never dropped
            batch = [self.records.popleft() for _ in range(n)]
            # shielded: a cancelled cutter still spools what it took
            await asyncio.shield(self.uploader.add(batch, run_id=self.step_run))

    async def cut_all(self) -> None:
        """Every record still held, spooled; after any cut in flight has been."""
        async with self._cutting:
            while self.records:
                await self._cut()

    async def cutter(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(CUT_POLL_S)
            full = len(self.records) >= self.opts.batch_max_requests
            if full or (self.records and time.monotonic() - last >= self.opts.batch_interval_s):
                await self.cut()
                last = time.monotonic()

    async def heartbeats(self) -> None:
        job = self.job
        lost = self.uploader.lost_event()
        while True:
            try:
                t1 = time.time_ns()
                resp = await self.client.heartbeat(
                    job.job_id,
                    HeartbeatRequest(lease_id=job.lease_id, progress=self.progress_now()),
                )
                t2, t3 = resp.clock_t2_ns, resp.clock_t3_ns
                if t2 is not None and t3 is not None:
                    self.clock.add(Exchange(t1, t2, t3, time.time_ns()))
            except ServerUnreachable as e:
                log.info("job %s: heartbeat not sent: %s", job.job_id, e)
            except (LeaseLost, NotFound) as e:
                if self.completing:  # the job ended by our own completion (its answer is due)
                    return
                self.uploader.lose(f"lease lost at heartbeat: {e}")
                self.stop_load()
                return
            except (AuthError, ProtocolError) as e:
                log.warning("job %s: heartbeat refused: %s", job.job_id, e)
            else:
                if resp.cancel and not self.cancelled:
                    log.info("job %s: cancel requested; stopping the load", job.job_id)
                    self.cancelled = True
                    self.stop_load()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lost.wait(), self.opts.heartbeat_interval_s)
            if lost.is_set():
                self.stop_load()
                return

    async def watch_stop(self) -> None:
        await self.worker_stop.wait()
        log.info("job %s: worker stopping; ending the load", self.job.job_id)
        self.stopping = True
        self.deadline = time.monotonic() + self.opts.shutdown_grace_s
        self.stop_load()
