"""Bodies a worker sends for probe jobs and device telemetry (routes in
app/api/routes_probes.py; worker scope):

    POST /api/v1/jobs/{job_id}/probe-result  ProbeResultUpload -> ProbeResultAck
    POST /api/v1/jobs/{job_id}/telemetry     TelemetryUpload   -> TelemetryAck

A probe job then completes like any job (``/complete`` with ``total_batches: 0``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from app.protocol.nul import no_nul


class _W(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ArtifactUpload(_W):
    name: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9._-]+$")
    content_type: Annotated[str, AfterValidator(no_nul), Field(max_length=64)] = (
        "application/octet-stream"
    )
    data_b64: str


class ProbeResultUpload(_W):
    lease_id: str
    status: Literal["succeeded", "failed"]
    error: str | None = None
    fingerprint: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    telemetry: list[dict[str, Any]] = Field(default_factory=list)
    artifacts: list[ArtifactUpload] = Field(default_factory=list)


class ProbeResultAck(_W):
    probe_id: str
    status: str
    duplicate: bool
    artifacts: int


class TelemetrySample(_W):
    t_s: float
    util_pct: float | None = None
    mem_used_mb: float | None = None
    power_w: float | None = None
    sm_clock_mhz: int | None = None


class TelemetryUpload(_W):
    lease_id: str
    seq: int = Field(0, ge=0)
    samples: list[TelemetrySample] = Field(max_length=100_000)


class TelemetryAck(_W):
    accepted: int
    duplicate: bool
