"""The job kinds this worker runs, found by name: one module per kind implementing
``WorkerJobKind`` (``app.worker.job``), the server's side being ``app.services.job_kinds``."""

from __future__ import annotations

from app.worker.bench_job import run_bench
from app.worker.job import JobOutcome, JobRun, WorkerJobKind
from app.worker.probe_job import run_probe
from app.worker.sweep_job import run_sweep

KINDS: dict[str, WorkerJobKind] = {"bench": run_bench, "sweep": run_sweep, "probe": run_probe}


async def cannot_run(jr: JobRun) -> JobOutcome:
    """A leased job of a kind this worker has no module for: it fails, saying so."""
    return await jr.complete("failed", f"this worker cannot run {jr.job.kind!r} jobs")


def runner_of(kind: str) -> WorkerJobKind:
    return KINDS.get(kind, cannot_run)
