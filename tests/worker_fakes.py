"""An in-memory stand-in for the server side of the worker protocol (``app.protocol.wire``), served
through ``httpx.MockTransport``: unit tests of the worker's behaviour (dedup, lost leases,
outages, lost responses) without a database. The real server is tested in test_worker.py."""

from __future__ import annotations

import datetime as dt
import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

import httpx

from app.protocol.wire import (
    CompleteRequest,
    HeartbeatRequest,
    JobProgress,
    LeasedJob,
    RegisterRequest,
    ResultBatch,
)


@dataclass
class FakeJob:
    job_id: str
    spec: dict[str, Any]
    run_id: str
    state: str = "queued"
    attempt: int = 0
    lease_id: str | None = None
    cancel: bool = False
    batches: dict[int, int] = field(default_factory=dict)  # batch_no -> requests
    requests: dict[int, int] = field(default_factory=dict)  # index -> times stored
    statuses: dict[int, str] = field(default_factory=dict)
    completion: CompleteRequest | None = None
    progress: list[JobProgress] = field(default_factory=list)
    duplicate_batches: int = 0


@dataclass
class FakeServer:
    token: str = "tok"
    down: bool = False
    lose_response_for: set[tuple[str, int]] = field(default_factory=set)  # (path kind, n)
    heartbeat_409: bool = False
    # cancel at the Nth heartbeat whose progress shows measured requests sent (the heartbeats
    # of a slow start, before any request, don't count: the same test on any machine)
    cancel_after_heartbeats: int | None = None
    sending_heartbeats: int = 0
    missing_once: list[int] = field(default_factory=list)
    jobs: dict[str, FakeJob] = field(default_factory=dict)
    registrations: list[RegisterRequest] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    heartbeats: int = 0
    failed_connects: int = 0

    def add_job(self, spec: dict[str, Any]) -> FakeJob:
        jid = secrets.token_hex(4)
        job = FakeJob(job_id=jid, spec=spec, run_id=f"run{jid}")
        self.jobs[jid] = job
        return job

    def lease_job(self, job: FakeJob) -> LeasedJob:
        job.state = "leased"
        job.attempt += 1
        job.lease_id = secrets.token_hex(4)
        return self._leased(job)

    def _leased(self, job: FakeJob) -> LeasedJob:
        assert job.lease_id is not None
        return LeasedJob(
            job_id=job.job_id,
            kind="bench",
            spec=job.spec,
            run_id=job.run_id,
            attempt=job.attempt,
            lease_id=job.lease_id,
            lease_expires_at=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30),
        )

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix("/api/v1")
        self.calls.append(path)
        if self.down:
            self.failed_connects += 1
            raise httpx.ConnectError("connection refused", request=request)
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return httpx.Response(401, json={"detail": "bad token"})
        body = json.loads(request.content or b"{}")
        if path == "/workers/register":
            self.registrations.append(RegisterRequest.model_validate(body))
            return httpx.Response(
                200,
                json={
                    "worker_id": "w1",
                    "lease_ttl_s": 30.0,
                    "heartbeat_interval_s": 0.2,
                    "poll_interval_s": 0.1,
                },
            )
        if re.fullmatch(r"/workers/[^/]+/lease", path):
            for queued in self.jobs.values():
                if queued.state == "queued":
                    return httpx.Response(
                        200, json={"job": self.lease_job(queued).model_dump(mode="json")}
                    )
            return httpx.Response(200, json={"job": None})
        m = re.fullmatch(r"/jobs/([^/]+)/(heartbeat|results|complete)", path)
        if m is None:
            return httpx.Response(404, json={"detail": "no route"})
        job = self.jobs.get(m.group(1))
        if job is None:
            return httpx.Response(404, json={"detail": "no job"})
        if body.get("lease_id") != job.lease_id or job.state not in ("leased", "running"):
            return httpx.Response(409, json={"detail": "lease lost"})
        route = {"heartbeat": self._heartbeat, "results": self._results}.get(
            m.group(2), self._complete
        )
        return route(request, job, body)

    def _heartbeat(self, request: httpx.Request, job: FakeJob, body: Any) -> httpx.Response:
        hb = HeartbeatRequest.model_validate(body)
        self.heartbeats += 1
        if self.heartbeat_409:
            return httpx.Response(409, json={"detail": "lease lost"})
        if hb.progress is not None:
            job.progress.append(hb.progress)
            self.sending_heartbeats += hb.progress.sent > 0
        if self.cancel_after_heartbeats is not None and self.sending_heartbeats >= (
            self.cancel_after_heartbeats
        ):
            job.cancel = True
        job.state = "running"
        return httpx.Response(
            200,
            json={"cancel": job.cancel, "lease_expires_at": dt.datetime.now(dt.UTC).isoformat()},
        )

    def _results(self, request: httpx.Request, job: FakeJob, body: Any) -> httpx.Response:
        batch = ResultBatch.model_validate(body)
        if batch.batch_no in job.batches:
            job.duplicate_batches += 1
            ack = {"batch_no": batch.batch_no, "accepted": 0, "duplicate": True}
            return httpx.Response(200, json=ack)
        accepted = 0
        for w in batch.requests:
            rec = w.to_record()  # must decode
            if w.index not in job.requests:
                accepted += 1
            job.requests[w.index] = job.requests.get(w.index, 0) + 1
            job.statuses[w.index] = rec.status.value
        job.batches[batch.batch_no] = len(batch.requests)
        if ("results", batch.batch_no) in self.lose_response_for:
            self.lose_response_for.discard(("results", batch.batch_no))
            raise httpx.ReadError("connection reset after the batch was stored", request=request)
        return httpx.Response(
            200, json={"batch_no": batch.batch_no, "accepted": accepted, "duplicate": False}
        )

    def _complete(self, request: httpx.Request, job: FakeJob, body: Any) -> httpx.Response:
        req = CompleteRequest.model_validate(body)
        if self.missing_once:
            missing, self.missing_once = self.missing_once, []
            for n in missing:
                job.batches.pop(n, None)
            return httpx.Response(409, json={"detail": f"batches missing: {missing} (of 9)"})
        missing = sorted(set(range(req.total_batches)) - set(job.batches))
        if missing:
            return httpx.Response(409, json={"detail": f"batches missing: {missing}"})
        job.completion = req
        job.state = req.status
        return httpx.Response(
            200, json={"job_id": job.job_id, "state": req.status, "run_id": job.run_id}
        )
