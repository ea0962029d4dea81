"""Job kind ``bench`` on the worker: run the load on its own thread (``LoadThread``) with
its observers (``app.client.execute``), heartbeat, upload finished requests in numbered
batches as they come, and complete the job with the run's metadata."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from pydantic import ValidationError

from app.client.execute import execute, series_to_wire
from app.client.shards.worker_share import ShardFigures, shard_row
from app.worker.client import describe
from app.worker.job import JobOutcome, JobRun, spec_from_job
from app.worker.load_thread import LoadThread
from app.worker.processes import with_worker_processes
from app.worker.shard_gate import ShardGate

log = logging.getLogger(__name__)


async def run_bench(jr: JobRun) -> JobOutcome:
    """``WorkerJobKind`` of a bench job."""
    job = jr.job
    try:
        spec = spec_from_job(job.spec)
    except ValidationError as e:
        return await jr.complete("failed", f"invalid run spec: {e}")
    shard: tuple[ShardFigures, ShardGate] | None = None
    # the worker's --processes: a plain run's, or a shard's share, dealt over them
    spec, jr.load_note = with_worker_processes(spec, jr.opts.processes)
    if job.shard is not None:  # one shard of a run dealt over workers
        figures = ShardFigures(job.shard, spec.shards)
        stopped = lambda: jr.cancelled or jr.stopping or jr.uploader.lost is not None  # noqa: E731
        gate = ShardGate(jr.client, job, jr.clock, figures, asyncio.get_running_loop(), stopped)
        shard = (figures, gate)
    jr.load = LoadThread(
        spec,
        run_tag=job.run_id or job.job_id,
        on_record=jr.on_record,
        on_progress=jr.on_progress,
        kernel_stamps=jr.opts.kernel_stamps,
        realtime=jr.opts.realtime,
        dataset_dirs=jr.opts.dataset_dirs,
        allow_link_local=jr.opts.allow_link_local,
        shard=shard,
    )
    side = [
        asyncio.create_task(jr.heartbeats(), name=f"heartbeat-{job.job_id}"),
        asyncio.create_task(jr.cutter(), name=f"cut-{job.job_id}"),
        asyncio.create_task(jr.watch_stop(), name=f"watch-{job.job_id}"),
    ]
    try:
        done = await execute(
            spec,
            jr.load_result,
            on_scraper=jr.on_scraper,
            allow_link_local=jr.opts.allow_link_local,
        )
        error = None
        if done.error is not None:
            error = f"the load failed: {describe(done.error)}"
            log.error("job %s: load failed", job.job_id, exc_info=done.error)
        await jr.cut_all()
        if jr.uploader.lost is not None:
            return jr.drop(jr.uploader.lost)
        status, error = jr.final_status(done.result, error)
        if done.meta is not None:
            jr.server_series = series_to_wire(done.series) or None
        if done.meta is not None and shard is not None:  # its row of the "By shard" table
            est = jr.clock.estimate()
            row = shard_row(shard[0], done.result) | {"clock": est.as_dict() if est else None}
            done.meta.load_stats["shard"] = row
        return await jr.complete(status, error, done.meta)
    finally:
        jr.stop_load()
        for t in side:
            t.cancel()
        for t in side:
            with contextlib.suppress(asyncio.CancelledError):
                await t
