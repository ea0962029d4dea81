"""Device telemetry for every job on a GPU worker (``job_telemetry``: NVML samples about
once a second, uploaded when the job ends), and the retrying POST it and the probe kind use."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel

from app.protocol.probe_wire import TelemetryAck, TelemetryUpload
from app.protocol.wire import LeasedJob
from app.worker.client import ServerUnreachable, WorkerClient, describe

log = logging.getLogger(__name__)
POST_TRIES = 5


async def post_retrying(client: WorkerClient, path: str, body: BaseModel, model: type[Any]) -> Any:
    """POST with a few retries while the server is unreachable."""
    delay = 0.5
    for attempt in range(POST_TRIES):
        try:
            return await client._post(path, body, model)
        except ServerUnreachable:
            if attempt == POST_TRIES - 1:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 8.0)
    raise AssertionError("unreachable")


def _gpu_index(job: LeasedJob) -> int | None:
    """The GPU a job uses for telemetry: a probe's CUDA device, else GPU 0."""
    if job.kind == "probe":
        probe = job.spec.get("probe") or {}
        if probe.get("device") == "cpu":
            return None
        return int(probe.get("device_index") or 0)
    return 0


@contextlib.asynccontextmanager
async def job_telemetry(client: WorkerClient, job: LeasedJob) -> AsyncIterator[None]:
    """Sample the job's GPU about once a second (NVML); upload the series at the end.
    Without NVML or a GPU nothing is sampled and nothing is sent."""
    from app.probes.device_telemetry import Sampler

    index = _gpu_index(job)
    sampler = await asyncio.to_thread(Sampler.start, index) if index is not None else None
    try:
        yield
    finally:
        if sampler is not None:
            samples = await asyncio.to_thread(sampler.stop)
            body = TelemetryUpload(lease_id=job.lease_id, seq=0, samples=samples)  # type: ignore[arg-type]
            try:
                await post_retrying(client, f"/jobs/{job.job_id}/telemetry", body, TelemetryAck)
            except Exception as e:  # telemetry is an extra: the job's outcome stands
                log.warning("job %s: telemetry not uploaded: %s", job.job_id, describe(e))
