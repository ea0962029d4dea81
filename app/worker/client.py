"""A typed HTTP client for the worker protocol (``app.protocol.wire``), over httpx.

Failures come out as distinct exceptions so the worker loop can react to each:

- ``ServerUnreachable``: connect/read errors, timeouts, and 502/503/504 (a restarting
  server or its proxy): retry later with backoff;
- ``AuthError``: 401/403: the token is wrong or lacks the ``worker`` scope;
- ``LeaseLost``: 409 on heartbeat/results/complete: the job is no longer ours;
  ``BatchesMissing`` (a ``LeaseLost`` subclass only by status code, not meaning) is the 409
  that ``complete`` answers when some numbered batches never arrived;
- ``NotFound``: 404 (an unknown worker or job, e.g. after the server's database was reset);
- ``ProtocolError``: anything else unexpected (a 4xx/5xx, or a body that is not the model).
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from app.protocol.wire import (
    BatchAck,
    CompleteRequest,
    CompleteResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JobKind,
    LeasedJob,
    LeaseRequest,
    LeaseResponse,
    RegisterRequest,
    RegisterResponse,
    ResultBatch,
    ShardReady,
    ShardStart,
    StepComplete,
    StepCompleted,
    StepCreate,
    StepCreated,
)

API_PREFIX = "/api/v1"
M = TypeVar("M", bound=BaseModel)


class WorkerAPIError(Exception):
    """Base of every error this client raises."""


class ServerUnreachable(WorkerAPIError):
    pass


class AuthError(WorkerAPIError):
    pass


class NotFound(WorkerAPIError):
    pass


class ProtocolError(WorkerAPIError):
    pass


class LeaseLost(WorkerAPIError):
    pass


class BatchesMissing(WorkerAPIError):
    def __init__(self, message: str, missing: list[int]) -> None:
        super().__init__(message)
        self.missing = missing


def error_detail(resp: httpx.Response) -> Any:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:500]
    return body.get("detail", body) if isinstance(body, dict) else body


def missing_batches(detail: Any) -> list[int] | None:
    """Batch numbers a 409 ``complete`` names as missing, or None when it is not that 409.

    Accepts ``{"missing_batches": [..]}`` / ``{"missing": [..]}`` details, or a message like
    ``batches missing: [3, 4] (of total_batches=5)`` (what ``app.services.jobs`` says)."""
    if isinstance(detail, dict):
        for key in ("missing_batches", "missing", "batches_missing"):
            v = detail.get(key)
            if isinstance(v, list) and all(isinstance(x, int) for x in v):
                return [int(x) for x in v]
        detail = detail.get("message") or detail.get("error") or ""
    if isinstance(detail, str):
        m = re.search(r"missing\W*\[([\d,\s]*)\]", detail, re.IGNORECASE)
        if m:
            return [int(x) for x in re.findall(r"\d+", m.group(1))]
    return None


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class WorkerClient:
    """One connection pool to the server; use as ``async with WorkerClient(...) as c``."""

    def __init__(
        self,
        server_url: str,
        token: str,
        *,
        timeout_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.server_url = server_url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.server_url + API_PREFIX,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0)),
            transport=transport,
            trust_env=False,
        )

    async def __aenter__(self) -> WorkerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _post(self, path: str, body: BaseModel | bytes, model: type[M]) -> M:
        try:
            # pydantic's JSON (inf/nan become null: strict JSON); bytes are a spooled batch
            data = body if isinstance(body, bytes) else body.model_dump_json().encode()
            resp = await self._http.post(
                path, content=data, headers={"Content-Type": "application/json"}
            )
        except httpx.TransportError as e:
            raise ServerUnreachable(f"{self.server_url}: {describe(e)}") from e
        if resp.status_code in (502, 503, 504):
            raise ServerUnreachable(f"{self.server_url}: HTTP {resp.status_code}")
        if resp.status_code in (401, 403):
            raise AuthError(f"HTTP {resp.status_code}: {error_detail(resp)}")
        if resp.status_code == 404:
            raise NotFound(f"{path}: {error_detail(resp)}")
        if resp.status_code == 409:
            detail = error_detail(resp)
            missing = missing_batches(detail) if path.endswith("/complete") else None
            if missing:
                raise BatchesMissing(f"{path}: batches missing: {missing}", missing)
            raise LeaseLost(f"{path}: {detail}")
        if resp.status_code >= 400:
            raise ProtocolError(f"{path}: HTTP {resp.status_code}: {error_detail(resp)}")
        try:
            return model.model_validate(resp.json())
        except (ValueError, ValidationError) as e:
            raise ProtocolError(f"{path}: unexpected response: {e}") from e

    async def register(self, req: RegisterRequest) -> RegisterResponse:
        return await self._post("/workers/register", req, RegisterResponse)

    async def lease(self, worker_id: str, kinds: list[JobKind]) -> LeasedJob | None:
        resp = await self._post(
            f"/workers/{worker_id}/lease", LeaseRequest(kinds=kinds), LeaseResponse
        )
        return resp.job

    async def heartbeat(self, job_id: str, req: HeartbeatRequest) -> HeartbeatResponse:
        return await self._post(f"/jobs/{job_id}/heartbeat", req, HeartbeatResponse)

    async def shard_ready(self, job_id: str, req: ShardReady) -> ShardStart:
        return await self._post(f"/jobs/{job_id}/shard-ready", req, ShardStart)

    async def upload(self, job_id: str, batch: ResultBatch | bytes) -> BatchAck:
        """Send one result batch (a ``ResultBatch`` or its JSON, as spooled)."""
        return await self._post(f"/jobs/{job_id}/results", batch, BatchAck)

    async def complete(self, job_id: str, req: CompleteRequest) -> CompleteResponse:
        return await self._post(f"/jobs/{job_id}/complete", req, CompleteResponse)

    async def create_step(self, job_id: str, req: StepCreate) -> StepCreated:
        return await self._post(f"/jobs/{job_id}/steps", req, StepCreated)

    async def complete_step(self, job_id: str, step_idx: int, req: StepComplete) -> StepCompleted:
        return await self._post(f"/jobs/{job_id}/steps/{step_idx}/complete", req, StepCompleted)
