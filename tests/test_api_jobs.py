"""Jobs and the worker protocol over HTTP with a fake worker, on SQLite and PostgreSQL:
leasing with requirements, heartbeats, idempotent batches, completion, lost leases,
cancellation, the progress stream and concurrent leasing."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import func, select

from app.services import jobs as job_svc
from app.storage import workers as worker_repo
from app.storage.models import Job, Request, utcnow
from tests.api_support import CAPS, Api, api_client, wire
from tests.live_server import make_token


@pytest.fixture
def api(db_url: str) -> Iterator[Api]:
    with api_client(db_url) as a:
        yield a


def _expire(api: Api, job_id: str) -> list[job_svc.Expiry]:
    """Make the job's lease run out now, then sweep."""
    with api.sessions.begin() as s:
        job = s.get(Job, job_id)
        assert job is not None
        job.lease_expires_at = utcnow() - dt.timedelta(seconds=1)
    return job_svc.expire_lost_leases(api.sessions)


def _rows(api: Api, run_id: str) -> int:
    with api.sessions() as s:
        return int(
            s.scalar(select(func.count()).select_from(Request).where(Request.run_id == run_id)) or 0
        )


def test_worker_protocol_end_to_end(api: Api) -> None:
    out = api.create_run(num_prompts=5, warmup_requests=1, goodput={"ttft": 50})
    rid, jid = out["run_id"], out["job_id"]
    wid = api.register()
    job = api.lease(wid)
    assert job is not None and job["job_id"] == jid and job["attempt"] == 1
    assert job["run_id"] == rid and job["spec"]["model"] == "sim"
    assert api.lease(wid) is None  # nothing else queued
    lid = job["lease_id"]
    assert api.client.get(f"/api/v1/jobs/{jid}").json()["state"] == "leased"

    progress = {"phase": "load", "planned": 6, "sent": 3, "done": 2, "tokens_per_s": 12.5}
    hb = api.post_job(jid, "heartbeat", {"lease_id": lid, "progress": progress})
    assert hb.status_code == 200 and hb.json()["cancel"] is False
    j = api.client.get(f"/api/v1/jobs/{jid}").json()
    assert j["state"] == "running" and j["progress"]["done"] == 2 and j["worker_id"] == wid
    assert api.client.get(f"/api/v1/runs/{rid}").json()["run"]["status"] == "running"

    b0 = {"lease_id": lid, "batch_no": 0, "requests": wire([0, 1, 2])}
    assert api.post_job(jid, "results", b0).json() == {
        "batch_no": 0,
        "accepted": 3,
        "duplicate": False,
    }
    retry = api.post_job(jid, "results", b0).json()
    assert retry == {"batch_no": 0, "accepted": 0, "duplicate": True}
    # a different batch number carrying already-stored requests adds no rows either
    b1 = {"lease_id": lid, "batch_no": 1, "requests": wire([2, 3, 4, 5])}
    assert api.post_job(jid, "results", b1).json()["accepted"] == 3
    assert _rows(api, rid) == 6

    early = {"lease_id": lid, "status": "succeeded", "total_batches": 3}
    r = api.post_job(jid, "complete", early)
    assert r.status_code == 409 and "[2]" in r.json()["detail"]

    meta = {"clock_source": "kernel", "validity": ["all good"], "client_host": "fakehost"}
    done = {"lease_id": lid, "status": "succeeded", "total_batches": 2, "run_meta": meta}
    r = api.post_job(jid, "complete", done)
    assert r.json() == {"job_id": jid, "state": "succeeded", "run_id": rid}
    assert api.post_job(jid, "complete", done).json()["state"] == "succeeded"  # retry
    assert api.post_job(jid, "heartbeat", {"lease_id": lid}).status_code == 409

    detail = api.client.get(f"/api/v1/runs/{rid}").json()
    assert detail["run"]["status"] == "succeeded"
    assert detail["run"]["summary"]["ttft_ms_p50"] == pytest.approx(20.0)
    report = detail["report"]
    assert report["clock_source"] == "kernel" and report["client_host"] == "fakehost"
    assert "all good" in report["validity"]["notes"]
    assert report["metrics"]["requests"]["completed_ok"] == 6
    assert report["metrics"]["ttft_ms"]["p50"] == pytest.approx(20.0)
    assert report["metrics"]["tpot_ms"]["p50"] == pytest.approx(5.0)
    page = api.client.get(f"/api/v1/runs/{rid}/requests", params={"limit": 4}).json()
    assert page["total"] == 6 and [r["index"] for r in page["items"]] == [0, 1, 2, 3]
    assert page["items"][1]["ttft_ms"] == pytest.approx(20.0)
    ev = api.client.get(f"/api/v1/runs/{rid}/requests/2/events").json()
    assert ev["t_ms"] == pytest.approx([40.0, 45.0, 50.0, 55.0])
    assert ev["kinds"] == ["content"] * 4 and ev["tokens"] == [1, 1, 1, 1]
    assert api.client.get(f"/api/v1/runs/{rid}/requests/99/events").status_code == 404
    job_after = api.client.get(f"/api/v1/jobs/{jid}").json()
    assert job_after["state"] == "succeeded" and job_after["finished_at"]
    workers = api.client.get("/api/v1/workers").json()
    assert workers["total"] == 1 and workers["items"][0]["online"] is True
    assert workers["items"][0]["capabilities"]["gpus"][0]["name"].startswith("NVIDIA H100")


def test_batch_validation(api: Api) -> None:
    out = api.create_run(num_prompts=3)
    job = api.lease(api.register())
    assert job is not None
    jid, lid = out["job_id"], job["lease_id"]
    bad = api.post_job(jid, "results", {"lease_id": lid, "batch_no": 0, "requests": wire([3])})
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["body", "requests", 0, "index"]
    req = wire([0])[0] | {"events_b64": "!!!"}
    bad = api.post_job(jid, "results", {"lease_id": lid, "batch_no": 0, "requests": [req]})
    assert bad.status_code == 422 and "events_b64" in bad.json()["detail"][0]["loc"]
    dup = api.post_job(jid, "results", {"lease_id": lid, "batch_no": 0, "requests": wire([1, 1])})
    assert dup.status_code == 422
    assert _rows(api, out["run_id"]) == 0
    # none of the refused uploads recorded batch 0: it can still be sent
    ok = api.post_job(jid, "results", {"lease_id": lid, "batch_no": 0, "requests": wire([0])})
    assert ok.json()["accepted"] == 1
    lost = api.post_job(jid, "results", {"lease_id": "x" * 32, "batch_no": 1, "requests": []})
    assert lost.status_code == 409


@pytest.mark.parametrize(
    ("requirements", "matches"),
    [
        ({}, True),
        ({"labels": {"pool": "a"}}, True),
        ({"labels": {"pool": "b"}}, False),
        ({"labels": {"zone": "x"}}, False),
        ({"gpu_name": "h100"}, True),
        ({"gpu_name": "A100"}, False),
        ({"min_gpu_memory_mb": 80000}, True),
        ({"min_gpu_memory_mb": 90000}, False),
        ({"gpu_name": "H100", "min_gpu_memory_mb": 81559, "labels": {"pool": "a"}}, True),
    ],
)
def test_requirements_are_matched_against_capabilities(
    api: Api, requirements: dict[str, Any], matches: bool
) -> None:
    out = api.create_run(requirements=requirements)
    job = api.lease(api.register())
    assert (job is not None and job["job_id"] == out["job_id"]) is matches


def test_unmatched_job_waits_for_a_suitable_worker(api: Api) -> None:
    big = api.create_run(requirements={"gpu_name": "B200"})["job_id"]
    small = api.create_run()["job_id"]
    job = api.lease(api.register())
    assert job is not None and job["job_id"] == small  # the older, unmatched job is skipped
    cpu_only = CAPS | {"gpus": []}
    assert api.lease(api.register(cpu_only)) is None
    b200 = CAPS | {"gpus": [{"index": 0, "name": "NVIDIA B200", "memory_total_mb": 180000}]}
    job = api.lease(api.register(b200))
    assert job is not None and job["job_id"] == big


def test_lost_lease_requeues_then_fails_at_max_attempts(db_url: str) -> None:
    with api_client(db_url, max_attempts=2) as api:
        out = api.create_run()
        jid, rid = out["job_id"], out["run_id"]
        wid = api.register()
        first = api.lease(wid)
        assert first is not None and first["attempt"] == 1
        assert api.post_job(jid, "heartbeat", {"lease_id": first["lease_id"]}).status_code == 200
        assert [e.outcome for e in _expire(api, jid)] == ["requeued"]
        j = api.client.get(f"/api/v1/jobs/{jid}").json()
        assert j["state"] == "queued" and "attempt 1 lost" in j["error"]
        assert api.client.get(f"/api/v1/runs/{rid}").json()["run"]["status"] == "queued"
        # the lost worker's late heartbeat is refused
        assert api.post_job(jid, "heartbeat", {"lease_id": first["lease_id"]}).status_code == 409
        second = api.lease(wid)
        assert second is not None and second["attempt"] == 2
        assert second["lease_id"] != first["lease_id"]
        assert [e.outcome for e in _expire(api, jid)] == ["failed"]
        j = api.client.get(f"/api/v1/jobs/{jid}").json()
        assert j["state"] == "failed" and "2 attempts" in j["error"]
        run = api.client.get(f"/api/v1/runs/{rid}").json()["run"]
        assert run["status"] == "failed" and run["finished_at"]
        assert api.lease(wid) is None


def test_lost_lease_after_uploads_keeps_them_and_marks_the_run_partial(api: Api) -> None:
    out = api.create_run(num_prompts=6)
    jid, rid = out["job_id"], out["run_id"]
    job = api.lease(api.register())
    assert job is not None
    body = {"lease_id": job["lease_id"], "batch_no": 0, "requests": wire([0, 1, 2, 3])}
    assert api.post_job(jid, "results", body).status_code == 200
    assert [e.outcome for e in _expire(api, jid)] == ["partial"]
    j = api.client.get(f"/api/v1/jobs/{jid}").json()
    assert j["state"] == "failed" and j["error"] == "worker lost"
    detail = api.client.get(f"/api/v1/runs/{rid}").json()
    assert detail["run"]["status"] == "partial"
    notes = detail["report"]["validity"]["notes"]
    assert any("4 of 6 planned requests were stored" in n for n in notes), notes
    assert detail["report"]["metrics"]["requests"]["completed_ok"] == 4
    assert _rows(api, rid) == 4


def test_sweep_leaves_live_leases_alone_and_restart_extends_them(api: Api) -> None:
    out = api.create_run()
    job = api.lease(api.register())
    assert job is not None
    assert job_svc.expire_lost_leases(api.sessions) == []
    with api.sessions.begin() as s:
        row = s.get(Job, out["job_id"])
        assert row is not None
        row.lease_expires_at = utcnow() - dt.timedelta(seconds=5)
    assert job_svc.extend_leases(api.sessions, ttl_s=30) == 1  # what server start does
    assert job_svc.expire_lost_leases(api.sessions) == []
    hb = api.post_job(out["job_id"], "heartbeat", {"lease_id": job["lease_id"]})
    assert hb.status_code == 200


def test_cancel_reaches_the_worker_at_its_next_heartbeat(api: Api) -> None:
    out = api.create_run(num_prompts=4)
    jid, rid = out["job_id"], out["run_id"]
    job = api.lease(api.register())
    assert job is not None
    lid = job["lease_id"]
    assert api.post_job(jid, "heartbeat", {"lease_id": lid}).json()["cancel"] is False
    r = api.client.post(f"/api/v1/runs/{rid}/cancel", headers=api.h(api.run))
    assert r.json() == {"run_id": rid, "job_id": jid, "state": "running", "cancel_requested": True}
    assert api.post_job(jid, "heartbeat", {"lease_id": lid}).json()["cancel"] is True
    body = {"lease_id": lid, "batch_no": 0, "requests": wire([0, 1])}
    assert api.post_job(jid, "results", body).status_code == 200
    done = {"lease_id": lid, "status": "cancelled", "total_batches": 1}
    assert api.post_job(jid, "complete", done).json()["state"] == "cancelled"
    detail = api.client.get(f"/api/v1/runs/{rid}").json()
    assert detail["run"]["status"] == "cancelled"  # what it stored is kept (issue 24)
    assert any("2 of 4" in n for n in detail["report"]["validity"]["notes"])
    assert detail["report"]["validity"]["verdict"] == "cancelled"


def test_worker_failure_without_results_fails_the_run(api: Api) -> None:
    out = api.create_run()
    job = api.lease(api.register())
    assert job is not None
    body = {"lease_id": job["lease_id"], "status": "failed", "error": "boom", "total_batches": 0}
    assert api.post_job(out["job_id"], "complete", body).json()["state"] == "failed"
    assert api.client.get(f"/api/v1/jobs/{out['job_id']}").json()["error"] == "boom"
    assert api.client.get(f"/api/v1/runs/{out['run_id']}").json()["run"]["status"] == "failed"


def test_a_worker_token_acts_only_on_its_own_workers_jobs(api: Api) -> None:
    stranger = make_token(api.db_url, "worker", name="stranger")
    out = api.create_run()
    wid = api.register()
    r = api.client.post(f"/api/v1/workers/{wid}/lease", json={}, headers=api.h(stranger))
    assert r.status_code == 403
    job = api.lease(wid)
    assert job is not None
    r = api.client.post(
        f"/api/v1/jobs/{out['job_id']}/heartbeat",
        json={"lease_id": job["lease_id"]},
        headers=api.h(stranger),
    )
    assert r.status_code == 403
    r = api.client.post("/api/v1/workers/nope/lease", json={}, headers=api.h(api.worker))
    assert r.status_code == 404


def test_progress_stream_yields_events_and_ends(api: Api) -> None:
    out = api.create_run()
    jid = out["job_id"]
    job = api.lease(api.register())
    assert job is not None
    lid = job["lease_id"]

    def drive() -> None:
        for done in (1, 2, 3):
            progress = {"phase": "load", "planned": 6, "done": done}
            api.post_job(jid, "heartbeat", {"lease_id": lid, "progress": progress})
            threading.Event().wait(0.7)
        api.post_job(jid, "complete", {"lease_id": lid, "status": "succeeded", "total_batches": 0})

    t = threading.Thread(target=drive)
    t.start()
    events: list[tuple[str, str]] = []
    with api.client.stream("GET", f"/api/v1/jobs/{jid}/progress/stream") as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        name = ""
        for line in resp.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, line[6:]))
    t.join()
    kinds = [n for n, _ in events]
    assert kinds[-1] == "end" and json.loads(events[-1][1])["state"] == "succeeded"
    progress = [json.loads(d) for n, d in events if n == "progress"]
    assert len(progress) >= 3
    assert progress[-1]["state"] == "succeeded"
    assert any((p["progress"] or {}).get("done") == 2 for p in progress)
    assert api.client.get("/api/v1/jobs/nope/progress/stream").status_code == 404


def test_job_listing(api: Api) -> None:
    a = api.create_run()["job_id"]
    b = api.create_run()["job_id"]
    api.lease(api.register())
    r = api.client.get("/api/v1/jobs").json()
    assert r["total"] == 2 and [j["id"] for j in r["items"]] == [b, a]
    assert [j["id"] for j in api.client.get("/api/v1/jobs?state=queued").json()["items"]] == [b]
    assert api.client.get("/api/v1/jobs?state=bogus").status_code == 422


def test_concurrent_leases_never_hand_out_a_job_twice(api: Api) -> None:
    n_jobs, n_threads = 30, 6
    job_ids = {api.create_run()["job_id"] for _ in range(n_jobs)}
    worker_ids = [api.register() for _ in range(n_threads)]
    got: list[list[str]] = [[] for _ in range(n_threads)]
    start = threading.Barrier(n_threads)
    errors: list[BaseException] = []

    def take(i: int) -> None:
        try:
            start.wait()
            while True:
                with api.sessions() as s:
                    w = worker_repo.get_worker(s, worker_ids[i])
                    assert w is not None
                    leased = job_svc.lease(
                        s,
                        w,
                        ["bench"],
                        ttl_s=30,
                        box=api.app.state.secretbox,
                        lock=api.app.state.lease_lock,
                    )
                if leased is None:
                    return
                got[i].append(leased.job_id)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    handed = [j for g in got for j in g]
    assert len(handed) == len(set(handed)) == n_jobs
    assert set(handed) == job_ids
    with api.sessions() as s:
        states = set(s.scalars(select(Job.state)))
    assert states == {"leased"}
