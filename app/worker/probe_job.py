"""Job kind ``probe`` on the worker: heartbeat while the probe runs on a thread, upload its
result (fingerprint, result, telemetry, artifacts) and complete the job."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import threading
from typing import Any

from pydantic import ValidationError

from app.probes.spec import ProbeSpec
from app.protocol.probe_wire import (
    ArtifactUpload,
    ProbeResultAck,
    ProbeResultUpload,
)
from app.protocol.wire import (
    CompleteRequest,
    CompleteResponse,
    HeartbeatRequest,
    JobProgress,
    LeasedJob,
)
from app.worker.client import (
    AuthError,
    LeaseLost,
    NotFound,
    ProtocolError,
    ServerUnreachable,
    WorkerClient,
    describe,
)
from app.worker.device_telemetry import post_retrying
from app.worker.job import JobOutcome, JobRun

log = logging.getLogger(__name__)


class ProbeJob:
    def __init__(
        self, client: WorkerClient, job: LeasedJob, heartbeat_s: float, worker_stop: asyncio.Event
    ) -> None:
        self.client = client
        self.job = job
        self.heartbeat_s = heartbeat_s
        self.worker_stop = worker_stop
        self.halt = threading.Event()
        self.lost: str | None = None
        self.cancelled = False

    async def _heartbeats(self) -> None:
        job = self.job
        kind = (job.spec.get("probe") or {}).get("kind", "probe")
        while not self.halt.is_set():
            try:
                resp = await self.client.heartbeat(
                    job.job_id,
                    HeartbeatRequest(
                        lease_id=job.lease_id, progress=JobProgress(phase=f"probe {kind}")
                    ),
                )
                if resp.cancel:
                    self.cancelled = True
                    self.halt.set()
            except (LeaseLost, NotFound) as e:
                self.lost = f"lease lost at heartbeat: {e}"
                self.halt.set()
            except (ServerUnreachable, AuthError, ProtocolError) as e:
                log.info("job %s: heartbeat failed: %s", job.job_id, e)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.worker_stop.wait(), self.heartbeat_s)
            if self.worker_stop.is_set():
                self.halt.set()

    async def run(self) -> tuple[str | None, str | None]:
        """Run, upload and complete: (status or None when dropped, error)."""
        from app.probes.device import ProbeError
        from app.probes.runner import run_probe

        job = self.job
        try:
            spec = ProbeSpec.model_validate(job.spec.get("probe") or {})
        except ValidationError as e:
            return await self._finish("failed", f"invalid probe spec: {e}", None)
        hb = asyncio.create_task(self._heartbeats(), name=f"heartbeat-{job.job_id}")
        try:
            outcome = await asyncio.to_thread(run_probe, spec, stop=self.halt)
            error = None
        except ProbeError as e:
            outcome, error = None, str(e)
        except Exception as e:
            log.exception("job %s: probe failed", job.job_id)
            outcome, error = None, f"the probe failed: {describe(e)}"
        finally:
            self.halt.set()
            hb.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await hb
        if self.lost is not None:
            return None, self.lost
        if self.cancelled or self.worker_stop.is_set():
            return await self._complete("cancelled", "stopped before the probe finished")
        if outcome is None:
            return await self._finish("failed", error, None)
        body = ProbeResultUpload(
            lease_id=job.lease_id,
            status="succeeded",
            fingerprint=outcome.fingerprint,
            result=outcome.result,
            telemetry=outcome.telemetry,
            artifacts=[
                ArtifactUpload(
                    name=a.name,
                    content_type=a.content_type,
                    data_b64=base64.b64encode(a.data).decode("ascii"),
                )
                for a in outcome.artifacts
            ],
        )
        return await self._upload(body)

    async def _finish(
        self, status: str, error: str | None, fp: dict[str, Any] | None
    ) -> tuple[str | None, str | None]:
        body = ProbeResultUpload(
            lease_id=self.job.lease_id, status="failed", error=error or "failed", fingerprint=fp
        )
        return await self._upload(body)

    async def _upload(self, body: ProbeResultUpload) -> tuple[str | None, str | None]:
        try:
            path = f"/jobs/{self.job.job_id}/probe-result"
            await post_retrying(self.client, path, body, ProbeResultAck)
        except (LeaseLost, NotFound) as e:
            return None, f"lease lost: {e}"
        except ProtocolError as e:  # e.g. an artifact over the server's limit
            return await self._complete("failed", f"the server refused the result: {e}")
        return await self._complete(body.status, body.error)

    async def _complete(self, status: str, error: str | None) -> tuple[str | None, str | None]:
        req = CompleteRequest(
            lease_id=self.job.lease_id,
            status=status,  # type: ignore[arg-type]
            error=error,
            total_batches=0,
        )
        try:
            path = f"/jobs/{self.job.job_id}/complete"
            await post_retrying(self.client, path, req, CompleteResponse)
        except (LeaseLost, NotFound) as e:
            return None, f"lease lost: {e}"
        log.info("job %s: probe %s%s", self.job.job_id, status, f": {error}" if error else "")
        return status, error


async def run_probe(jr: JobRun) -> JobOutcome:
    """``WorkerJobKind`` of a probe job."""
    probe = ProbeJob(jr.client, jr.job, jr.opts.heartbeat_interval_s, jr.worker_stop)
    status, detail = await probe.run()
    await asyncio.to_thread(jr.spool.remove)
    return JobOutcome(jr.job.job_id, status, detail)  # type: ignore[arg-type]
