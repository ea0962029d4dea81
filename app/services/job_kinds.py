"""Job kinds behind one contract: what the job lifecycle (``app.services.jobs``) asks of a
kind, and the registry that finds a job's kind by name.

A kind is one module implementing ``JobKindRules``: ``bench`` (``app.services.bench_jobs``),
``sweep`` (``app.services.sweep_jobs``), ``probe`` (``app.services.probe_jobs``). Creating a
job takes arguments of the kind's own (a run spec, a sweep plan, a probe spec), so each kind
module has its own ``create_*`` function; leasing, results, completion and a lost lease go
through this contract. A new kind is one module and one line in ``KINDS``; the worker side
has the same registry (``app.worker.kinds``).
"""

from __future__ import annotations

from typing import Any, Protocol

from sqlalchemy.orm import Session, sessionmaker

from app.protocol.wire import CompleteRequest, CompleteResponse, JobKind, ResultBatch, SweepResume
from app.services.bench_jobs import BENCH
from app.services.job_rules import Arrival, Outcome
from app.services.probe_jobs import PROBE
from app.services.sweep_jobs import SWEEP
from app.storage.models import Job


class JobKindRules(Protocol):
    """What a kind decides in a job's life after it was created."""

    name: JobKind

    def bench_spec(self, job: Job) -> dict[str, Any]:
        """The bench spec whose planned requests a batch's indexes count ({} if none)."""
        ...

    def lease_resume(self, session: Session, job: Job) -> SweepResume | None:
        """What the lease answer carries for this attempt to resume (None: nothing)."""
        ...

    def batch_run(self, session: Session, job: Job, batch: ResultBatch) -> str | None:
        """The run a result batch goes to (an ``Invalid`` says why it can't)."""
        ...

    def missing_batches(self, session: Session, job: Job, total_batches: int) -> list[int]:
        """The batch numbers this attempt sent that have not arrived."""
        ...

    def recomplete(
        self, session: Session, sessions: sessionmaker[Session], job: Job, req: CompleteRequest
    ) -> None:
        """A retried completion of a job already ended: finish what the first try left."""
        ...

    def complete(
        self, session: Session, sessions: sessionmaker[Session], job: Job, req: CompleteRequest
    ) -> CompleteResponse:
        """End the job (every batch arrived): its state, its run's or sweep's outcome."""
        ...

    def kept_uploads(self, session: Session, job: Job) -> int:
        """How much of the job a lost lease leaves stored (0: nothing was kept)."""
        ...

    def resumes_after_loss(self, job: Job) -> bool:
        """Whether a lost lease requeues the job to resume, whatever it uploaded."""
        ...

    def loss(self, session: Session, job: Job) -> Arrival:
        """What a lost lease that ends the job lost of its run: notes (what did not arrive)
        and how many requests at least."""
        ...

    def after_loss(self, session: Session, job: Job, outcome: str) -> list[tuple[str, Outcome]]:
        """After a lost lease (``outcome``: requeued/failed/partial/cancelled): other runs
        to finalize, with their outcome."""
        ...


KINDS: dict[str, JobKindRules] = {k.name: k for k in (BENCH, SWEEP, PROBE)}


def rules_of(job: Job) -> JobKindRules:
    """The job's kind (a job of an unknown kind is a bug: KeyError names it)."""
    try:
        return KINDS[job.kind]
    except KeyError:
        raise KeyError(f"job {job.id!r} has an unknown kind {job.kind!r}") from None
