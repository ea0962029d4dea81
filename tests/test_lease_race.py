"""Two workers asking for a lease at the same moment on PostgreSQL: while one lease call is
in progress (its transaction open), the other still sees and takes another queued job. A
lease locks only the row it takes (``claim_queued``); it used to lock every candidate, so
the other call skipped them all and got nothing, even a job only it could run."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from cryptography.fernet import Fernet

from app.protocol.wire import JobRequirements, WorkerCapabilities
from app.services import jobs as job_svc
from app.services import workers as worker_svc
from app.services.secretbox import SecretBox
from app.storage import jobs as job_repo
from app.storage import workers as worker_repo
from app.storage.db import make_engine, session_factory
from app.storage.models import Worker

pytestmark = pytest.mark.postgres


def _worker(session: Any, label: str) -> Worker:
    caps = WorkerCapabilities(hostname=f"h-{label}", tokentrace_version="t", labels={"w": label})
    row = worker_repo.insert_worker(
        session,
        name=label,
        hostname=caps.hostname,
        capabilities=caps.model_dump(mode="json"),
        labels=dict(caps.labels),
        token_id=None,
    )
    session.commit()
    return row


def test_a_lease_in_progress_does_not_hide_other_jobs(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker A's lease call stops inside its transaction, after reading the queued jobs;
    worker B's call then runs to its end and must take the job labelled for B (A cannot run
    it), and A, released, takes its own."""
    factory = session_factory(make_engine(pg_url))
    box = SecretBox(Fernet.generate_key())
    with factory() as s:
        a, b = _worker(s, "a"), _worker(s, "b")
        ids = {}
        for label in ("a", "b"):
            req = JobRequirements(labels={"w": label}).model_dump(mode="json")
            job = job_repo.create_job(
                s, kind="bench", spec={}, requirements=req, run_id=None, max_attempts=1
            )
            ids[label] = job.id
        s.commit()

    in_a = threading.Event()
    go_on = threading.Event()
    real_matches = worker_svc.matches

    def matches(req: JobRequirements, caps: WorkerCapabilities) -> bool:
        if caps.labels.get("w") == "a" and not in_a.is_set():
            in_a.set()  # A's transaction is open and has read the queued jobs
            assert go_on.wait(10)
        return real_matches(req, caps)

    monkeypatch.setattr(worker_svc, "matches", matches)
    got: dict[str, Any] = {}

    def lease(worker: Worker, key: str) -> None:
        with factory() as s:
            w = s.get(Worker, worker.id)
            assert w is not None
            got[key] = job_svc.lease(s, w, ["bench"], ttl_s=60, box=box)

    ta = threading.Thread(target=lease, args=(a, "a"))
    ta.start()
    try:
        assert in_a.wait(10)
        lease(b, "b")  # while A's lease is in progress
    finally:
        go_on.set()
        ta.join(10)
    assert got["b"] is not None and got["b"].job_id == ids["b"]
    assert got["a"] is not None and got["a"].job_id == ids["a"]
