"""A result batch and its requests commit together or not at all (SQLite and PostgreSQL).

Each fault is injected at one step of ``POST /jobs/{id}/results`` after the batch row was
added: an exception in the service, a lock error half-way through the request rows, a lost
database connection, and a failed COMMIT. The upload fails; a retry with the same data
stores every request exactly once and completing the job finds nothing missing. Before the
fix, SQLite's savepoint (``begin_nested`` on pysqlite) committed the batch row on its own,
so the retry was answered ``duplicate`` and the run "succeeded" with 0 requests.

Completion also checks what arrived: a batch row whose requests are not stored makes the run
``partial`` with a note naming the missing indices; a lost worker's gaps in batch numbers
are named too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, func, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from app.services import bench_jobs
from app.services import jobs as job_svc
from app.storage import repository
from app.storage.models import JobBatch, Request
from tests.api_support import Api, api_client, wire
from tests.test_api_jobs import _expire

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def api(db_url: str) -> Iterator[Api]:
    with api_client(db_url) as a:
        yield a


def _indices(api: Api, run_id: str) -> list[int]:
    with api.sessions() as s:
        return list(s.scalars(select(Request.idx).where(Request.run_id == run_id)))


def _batches(api: Api, job_id: str) -> int:
    with api.sessions() as s:
        stmt = select(func.count()).select_from(JobBatch).where(JobBatch.job_id == job_id)
        return int(s.scalar(stmt) or 0)


def _post_expecting_failure(api: Api, job_id: str, body: dict[str, Any]) -> int:
    """Upload; the fault makes it fail as a 5xx answer or as the server's exception."""
    try:
        r = api.post_job(job_id, "results", body)
    except Exception:  # TestClient re-raises what the server did not answer
        return 500
    assert r.status_code >= 500, r.text
    return r.status_code


def _engine(api: Api) -> Engine:
    engine: Engine = api.app.state.engine
    return engine


def _kill_own_connection(api: Api, session: Session) -> None:
    """The database connection of ``session`` dies: PostgreSQL backend terminated from
    outside; SQLite connection closed under SQLAlchemy's feet."""
    raw: Any = session.connection().connection.dbapi_connection
    if _engine(api).dialect.name == "postgresql":
        pid = raw.info.backend_pid
        admin = create_engine(api.db_url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        finally:
            admin.dispose()
    else:
        raw.close()


Fault = Callable[[Api, pytest.MonkeyPatch], Callable[[], None] | None]  # returns an undo


def fault_raise_after_batch_row(api: Api, mp: pytest.MonkeyPatch) -> None:
    real = job_svc.store_requests

    def boom(session: Session, run_id: str, records: Any) -> int:
        real(session, run_id, records[:1])  # some rows written, then the service fails
        raise RuntimeError("injected: ingest failed after the batch row was added")

    mp.setattr(job_svc, "store_requests", boom)


def fault_locked_mid_requests(api: Api, mp: pytest.MonkeyPatch) -> None:
    real = repository.insert_rows

    def locked(conn: Any, run_id: str, rows: list[dict[str, Any]], *, replace: bool) -> None:
        real(conn, run_id, rows[: len(rows) // 2], replace=replace)
        raise OperationalError("INSERT INTO requests", {}, Exception("database is locked"))

    mp.setattr(repository, "insert_rows", locked)


def fault_lost_connection(api: Api, mp: pytest.MonkeyPatch) -> None:
    real = job_svc.store_requests

    def lost(session: Session, run_id: str, records: Any) -> int:
        _kill_own_connection(api, session)
        return real(session, run_id, records)

    mp.setattr(job_svc, "store_requests", lost)


def fault_commit_fails(api: Api, mp: pytest.MonkeyPatch) -> Callable[[], None]:
    """The COMMIT of the transaction that wrote a batch row fails (once)."""
    engine = _engine(api)
    fired: list[bool] = []

    def mark(conn: Any, _cur: Any, statement: str, *_a: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO JOB_BATCHES"):
            conn.info["wrote_batch"] = True

    def fail_commit(conn: Any) -> None:
        if conn.info.pop("wrote_batch", False) and not fired:
            fired.append(True)
            raise OperationalError("COMMIT", {}, Exception("disk I/O error"))

    event.listen(engine, "after_cursor_execute", mark)
    event.listen(engine, "commit", fail_commit)

    def undo() -> None:
        event.remove(engine, "commit", fail_commit)
        event.remove(engine, "after_cursor_execute", mark)
        assert fired, "the fault must have hit the batch's COMMIT"

    return undo


FAULTS: dict[str, Fault] = {
    "raise_after_batch_row": fault_raise_after_batch_row,
    "locked_mid_requests": fault_locked_mid_requests,
    "lost_connection": fault_lost_connection,
    "commit_fails": fault_commit_fails,
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_failed_ingest_stores_nothing_and_the_retry_stores_everything_once(
    api: Api, fault: str
) -> None:
    out = api.create_run(num_prompts=6)
    jid, rid = out["job_id"], out["run_id"]
    job = api.lease(api.register())
    assert job is not None
    lid = job["lease_id"]
    b0 = {"lease_id": lid, "batch_no": 0, "requests": wire([0, 1, 2, 3])}
    b1 = {"lease_id": lid, "batch_no": 1, "requests": wire([4, 5])}
    assert api.post_job(jid, "results", b0).json()["accepted"] == 4

    mp = pytest.MonkeyPatch()
    undo = None
    try:
        undo = FAULTS[fault](api, mp)
        status = _post_expecting_failure(api, jid, b1)
    finally:
        if undo is not None:
            undo()
        mp.undo()
    assert status in (500, 503)
    assert _batches(api, jid) == 1  # batch 1 left no row behind ...
    assert sorted(_indices(api, rid)) == [0, 1, 2, 3]  # ... and none of its requests

    retry = api.post_job(jid, "results", b1)
    assert retry.status_code == 200, retry.text
    assert retry.json() == {"batch_no": 1, "accepted": 2, "duplicate": False}
    assert api.post_job(jid, "results", b1).json()["duplicate"] is True
    done = {"lease_id": lid, "status": "succeeded", "total_batches": 2}
    assert api.post_job(jid, "complete", done).json()["state"] == "succeeded"
    assert sorted(_indices(api, rid)) == list(range(6))  # every request exactly once
    detail = api.client.get(f"/api/v1/runs/{rid}").json()
    assert detail["run"]["status"] == "succeeded"
    assert not [n for n in detail["report"]["validity"]["notes"] if "missing" in n]


def test_sqlite_savepoint_rolls_back_with_its_transaction(sqlite_url: str) -> None:
    """The root cause, at the storage layer: a batch row added in a savepoint must go when
    the enclosing transaction rolls back (pysqlite's SAVEPOINT outside a transaction, then
    RELEASE, used to commit it)."""
    from app.storage import jobs as job_repo
    from app.storage.db import make_engine, session_factory

    engine = make_engine(sqlite_url)
    try:
        sessions = session_factory(engine)
        with sessions() as s:
            from cryptography.fernet import Fernet

            from app.client.spec import RunSpec
            from app.protocol.wire import JobRequirements
            from app.services.secretbox import SecretBox

            spec = RunSpec.model_validate({"base_url": "http://127.0.0.1:9", "model": "m"})
            box = SecretBox(Fernet.generate_key())
            _, job_id = bench_jobs.create_bench_run(
                s, spec, requirements=JobRequirements(), name=None, max_attempts=1, box=box
            )
            s.commit()
        with sessions() as s:
            assert job_repo.batch_exists(s, job_id, 0) is False
            assert job_repo.add_batch(s, job_id, 0, 1, 3) is True
            s.rollback()
        with sessions() as s:
            assert job_repo.batch_exists(s, job_id, 0) is False
    finally:
        engine.dispose()


# ------------------------------------------------------------ what arrived, at complete


def _lose_requests(api: Api, run_id: str, indices: list[int]) -> None:
    """Requests a batch declared vanish (as a pre-fix database or a manual delete left them)."""
    with api.sessions.begin() as s:
        for row in s.scalars(
            select(Request).where(Request.run_id == run_id, Request.idx.in_(indices))
        ):
            s.delete(row)


def test_complete_marks_the_run_partial_naming_missing_requests(api: Api) -> None:
    out = api.create_run(num_prompts=6)
    jid, rid = out["job_id"], out["run_id"]
    job = api.lease(api.register())
    assert job is not None
    lid = job["lease_id"]
    for no, idx in enumerate(([0, 1, 2], [3, 4, 5])):
        body = {"lease_id": lid, "batch_no": no, "requests": wire(idx)}
        assert api.post_job(jid, "results", body).json()["accepted"] == 3
    _lose_requests(api, rid, [2, 4])
    done = {"lease_id": lid, "status": "succeeded", "total_batches": 2}
    assert api.post_job(jid, "complete", done).json()["state"] == "succeeded"
    detail = api.client.get(f"/api/v1/runs/{rid}").json()
    assert detail["run"]["status"] == "partial"
    notes = detail["report"]["validity"]["notes"]
    assert "2 of 6 requests missing: indices 2, 4" in notes, notes


def test_lost_worker_note_names_batches_that_never_arrived(api: Api) -> None:
    out = api.create_run(num_prompts=6)
    jid, rid = out["job_id"], out["run_id"]
    job = api.lease(api.register())
    assert job is not None
    lid = job["lease_id"]
    for no, idx in ((0, [0, 1]), (2, [4, 5])):  # batch 1 never arrives
        body = {"lease_id": lid, "batch_no": no, "requests": wire(idx)}
        assert api.post_job(jid, "results", body).status_code == 200
    assert [e.outcome for e in _expire(api, jid)] == ["partial"]
    detail = api.client.get(f"/api/v1/runs/{rid}").json()
    assert detail["run"]["status"] == "partial"
    notes = detail["report"]["validity"]["notes"]
    assert any("4 of 6 planned requests were stored" in n for n in notes), notes
    assert "batch 1 never arrived" in notes, notes


def test_concurrent_uploads_all_land_once(api: Api) -> None:
    """Savepoints in real transactions under contention: 4 threads upload 10 batches each to
    4 jobs at once; every upload answers 200 (no 'database is locked': on SQLite the
    transaction takes the write lock at BEGIN IMMEDIATE, waiting with the busy timeout)."""
    n_jobs, n_batches, per = 4, 10, 5
    wid = api.register()
    jobs = []
    for _ in range(n_jobs):
        out = api.create_run(num_prompts=n_batches * per)
        leased = api.lease(wid)
        assert leased is not None
        jobs.append((out["run_id"], out["job_id"], leased["lease_id"]))
    statuses: list[int] = []
    start = threading.Barrier(n_jobs)

    def upload(run: tuple[str, str, str]) -> None:
        _, jid, lid = run
        start.wait()
        for no in range(n_batches):
            idx = list(range(no * per, (no + 1) * per))
            body = {"lease_id": lid, "batch_no": no, "requests": wire(idx)}
            statuses.append(api.post_job(jid, "results", body).status_code)

    threads = [threading.Thread(target=upload, args=(j,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert statuses == [200] * (n_jobs * n_batches)
    for rid, jid, lid in jobs:
        assert sorted(_indices(api, rid)) == list(range(n_batches * per))
        done = {"lease_id": lid, "status": "succeeded", "total_batches": n_batches}
        assert api.post_job(jid, "complete", done).json()["state"] == "succeeded"
