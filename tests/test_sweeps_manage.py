"""A sweep's tags, note and deletion in the service (``app.services.sweeps``), on SQLite and
PostgreSQL: tags by the run tags' rule, a bad one refused naming it and nothing changed;
deletion takes the sweep, its job, its steps' runs and their requests (the database's
cascades), keeps the baselines that pointed at them pointing at nothing, and is refused
while a worker runs the sweep."""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from sqlalchemy.orm import Session, sessionmaker

from app.client.spec import RunSpec
from app.client.sweep_plan import SweepPlan
from app.domain import RequestRecord, RequestStatus
from app.protocol.wire import JobRequirements
from app.services import baselines as baseline_svc
from app.services import sweep_jobs
from app.services import sweeps as sweep_svc
from app.services.errors import Conflict, Invalid, NotFound
from app.services.runs import open_database
from app.services.secretbox import SecretBox
from app.storage import compare_repo
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage.db import session_scope


def _sweep_with_runs(sessions: sessionmaker[Session], n_requests: int = 3) -> tuple[str, list[str]]:
    with session_scope(sessions) as s:
        sweep_id = compare_repo.create_sweep(
            s, spec={"model": "m"}, mode="concurrencies", loads=[1.0, 2.0], status="succeeded"
        )
        run_ids = []
        for i in range(2):
            rid = repo.create_run(
                s, RunSpec(base_url="http://127.0.0.1:9", model="m", num_prompts=n_requests)
            )
            records = [
                RequestRecord(
                    index=k, scheduled_ns=k, sent_ns=k, end_ns=k + 10, status=RequestStatus.OK
                )
                for k in range(n_requests)
            ]
            repo.insert_requests(s, rid, records)
            compare_repo.add_step(
                s, sweep_id, step_idx=i, run_id=rid, load=float(i + 1), load_kind="concurrency"
            )
            run_ids.append(rid)
    return sweep_id, run_ids


def test_tags_and_note(db_url: str) -> None:
    sessions = open_database(db_url)
    sweep_id, _ = _sweep_with_runs(sessions, 1)
    with session_scope(sessions) as s:
        assert sweep_svc.set_tags(s, sweep_id, [" a ", "b", "a"]) == ["a", "b"]
        sweep_svc.set_note(s, sweep_id, "  why  ")
    for bad in (["x" * 101], [""]):
        with pytest.raises(Invalid) as e, session_scope(sessions) as s:
            sweep_svc.set_tags(s, sweep_id, bad)
        assert e.value.detail.startswith("tags:") and e.value.loc == ("body", "tags")
    with pytest.raises(Invalid) as e, session_scope(sessions) as s:
        sweep_svc.set_note(s, sweep_id, "n" * 100_001)
    assert e.value.detail == "note: at most 100,000 characters"
    with pytest.raises(NotFound), session_scope(sessions) as s:
        sweep_svc.set_tags(s, "nope", ["a"])
    summary = sweep_svc.sweep_summary(sessions, sweep_id)
    assert summary["tags"] == ["a", "b"] and summary["note"] == "why"
    with session_scope(sessions) as s:
        sweep_svc.set_note(s, sweep_id, "   ")
        row = compare_repo.find_sweep(s, sweep_id)
        assert row is not None and row.note is None


def test_delete_takes_runs_requests_and_job_keeps_baselines(db_url: str) -> None:
    sessions = open_database(db_url)
    sweep_id, run_ids = _sweep_with_runs(sessions)
    keep, keep_runs = _sweep_with_runs(sessions)
    with session_scope(sessions) as s:
        baseline_svc.save(s, sweep_id, "the-sweep")
        baseline_svc.save(s, run_ids[1], "a-step")
        what = sweep_svc.contents(s, sweep_id)
        assert what.run_ids == run_ids and what.n_requests == 6
        assert sorted(what.baselines) == ["a-step", "the-sweep"]
        gone = sweep_svc.delete_sweep(s, sweep_id)
        assert gone.run_ids == run_ids
    with session_scope(sessions) as s:
        assert compare_repo.find_sweep(s, sweep_id) is None
        assert all(repo.find_run(s, r) is None for r in run_ids)
        assert all(repo.count_requests(s, r) == 0 for r in run_ids)
        assert compare_repo.sweep_steps(s, sweep_id) == []
        b1 = compare_repo.current_baseline(s, "the-sweep")
        b2 = compare_repo.current_baseline(s, "a-step")
        assert b1 is not None and b1.sweep_id is None and b1.run_id is None
        assert b2 is not None and b2.run_id is None
        # the other sweep is untouched
        assert [st.run_id for st in compare_repo.sweep_steps(s, keep)] == keep_runs
        assert all(repo.count_requests(s, r) == 3 for r in keep_runs)
    with pytest.raises(NotFound), session_scope(sessions) as s:
        sweep_svc.delete_sweep(s, sweep_id)


def test_delete_refused_while_running_and_a_queued_job_goes_too(db_url: str) -> None:
    sessions = open_database(db_url)
    box = SecretBox(Fernet.generate_key())
    spec = RunSpec(base_url="http://127.0.0.1:9", model="m", num_prompts=2)
    plan = SweepPlan(mode="concurrencies", loads=(1.0, 2.0))
    with session_scope(sessions) as s:
        running, running_job = sweep_jobs.create_sweep_job(
            s, spec, plan, requirements=JobRequirements(), name=None, max_attempts=1, box=box
        )
        queued, queued_job = sweep_jobs.create_sweep_job(
            s, spec, plan, requirements=JobRequirements(), name=None, max_attempts=1, box=box
        )
        assert job_repo.transition(s, running_job, from_states=("queued",), state="running")
    with pytest.raises(Conflict) as e, session_scope(sessions) as s:
        sweep_svc.delete_sweep(s, running)
    assert "cancel it first" in e.value.detail
    with session_scope(sessions) as s:
        assert compare_repo.find_sweep(s, running) is not None
        sweep_svc.delete_sweep(s, queued)
    with session_scope(sessions) as s:
        assert compare_repo.find_sweep(s, queued) is None
        assert job_repo.get_job(s, queued_job) is None
