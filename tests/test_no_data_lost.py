"""Issue 23, items 1 and 2: a worker never drops data, and a run that lost any request is
never shown as valid (SQLite and PostgreSQL).

* Multi-turn runs through REST and a worker keep every turn: a batch's request indexes are
  bounded by sessions x turns (``index_bound``), not by sessions; beyond it, still a 422.
* The planned figure of a multi-turn run counts its turns (the worker's plan).
* A batch the server keeps refusing ends the job ``failed`` with the server's reason; the
  run counts the requests it lost and is never valid; the worker keeps the batches
  (``kept/``), and ``tokentrace recover`` stores them into the run afterwards.
* A completion that declares more requests than were stored, or a lost worker whose last
  heartbeat said more were sent than arrived, counts them lost: partial, not valid,
  everywhere the run is shown (API, report, pages, CLI, compare's trust issues).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

from app.analysis.verdict import run_trust_issues
from app.cli.main import main as cli_main
from app.cli.render import render_runs
from app.protocol.wire import LeasedJob
from app.services.job_rules import index_bound, planned_of, planned_text
from app.services.runs import list_runs, run_dict
from app.storage import repository as repo
from app.storage.db import session_scope
from app.targets.sim_config import SimConfig
from app.targets.simulator import SimulatorThread, start_simulator_thread
from app.web.runs_page import report_verdict
from app.web.runs_view import row_verdict, validity_card
from app.worker.backoff import Backoff
from app.worker.client import WorkerClient
from app.worker.job import JobOptions, JobRun
from app.worker.loop import Worker, WorkerOptions
from app.worker.spool import Spool
from tests.api_support import Api, api_client, record, wire
from tests.live_server import LiveServerFactory, live_server  # noqa: F401
from tests.test_api_jobs import _expire
from tests.worker_helpers import api, request_indices, submit, wait_job

pytestmark = pytest.mark.timeout(90)

FAST = WorkerOptions(
    backoff_initial_s=0.02,
    backoff_max_s=0.1,
    batch_interval_s=0.1,
    batch_max_requests=4,
    shutdown_grace_s=3.0,
    heartbeat_interval_s=0.2,
    poll_interval_s=0.1,
)
MULTI = {"dataset": "sharegpt", "multi_turn": True, "max_turns": 3, "num_prompts": 2}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorThread]:
    s = start_simulator_thread(SimConfig(ttft_ms=1, itl_ms=0.5, output_len=4, seed=5))
    yield s
    s.stop()


@pytest.fixture
def app_api(db_url: str) -> Iterator[Api]:
    with api_client(db_url) as a:
        yield a


def _seen(sim: SimulatorThread, run_id: str) -> int:
    """Requests the simulator served for this run (X-Request-Id starts with its run id)."""
    return sum(1 for rid in sim.ground_truth()["requests"] if rid.startswith(run_id))


def _run(api: Api, run_id: str) -> dict[str, Any]:
    r = api.client.get(f"/api/v1/runs/{run_id}", headers=api.h(api.admin))
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


# ------------------------------------------------------------------------ the index bound


def test_index_bound_counts_sessions_turns() -> None:
    assert index_bound({"num_prompts": 6, "warmup_requests": 2}) == 8
    assert index_bound(MULTI | {"warmup_requests": 1}) == 1 + 2 * 3
    assert index_bound({"multi_turn": True, "num_prompts": 8}) == 8 * 10_000
    assert index_bound({"multi_turn": True, "num_prompts": 10_000_000}) == 2**31  # the wire's
    # the planned figure: single requests from the spec; turns from the worker's plan
    assert planned_of({"num_prompts": 6, "warmup_requests": 2}) == 8
    assert planned_of(MULTI | {"warmup_requests": 1}, 5) == 6
    assert planned_of(MULTI, 10**9) == 6  # a plan past the bound is the bound
    assert planned_of(MULTI, None) is None
    assert planned_text(MULTI, None) == "up to 6 planned requests (2 sessions of up to 3 turns)"
    assert planned_text(MULTI, 5) == "5 planned requests"


def test_the_worker_cuts_a_session_at_the_bound_the_server_checks(tmp_path: Path) -> None:
    from app.client.sessions import MAX_SESSION_TURNS, build_session_workload
    from app.client.spec import RunSpec
    from app.client.tokenizer import load_tokenizer

    le = [m.le for m in RunSpec.model_fields["max_turns"].metadata if hasattr(m, "le")]
    assert le == [MAX_SESSION_TURNS]  # the largest max_turns a spec may ask for
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"turns": ["a b"] * (MAX_SESSION_TURNS + 5)}) + "\n")
    spec = RunSpec(base_url="http://127.0.0.1:9", model="m", dataset="jsonl",
                   dataset_path=str(path), multi_turn=True, num_prompts=1)  # fmt: skip
    sessions = build_session_workload(spec, load_tokenizer(None), [str(tmp_path)], None)
    assert [len(c.turns) for c in sessions.measured] == [MAX_SESSION_TURNS]
    assert index_bound(spec.model_dump()) == MAX_SESSION_TURNS  # what the server allows


def test_multi_turn_batches_within_sessions_x_turns_are_stored_beyond_refused(
    app_api: Api,
) -> None:
    out = app_api.create_run(**MULTI, warmup_requests=1)  # bound 1 + 2 x 3 = 7
    jid, rid = out["job_id"], out["run_id"]
    job = app_api.lease(app_api.register())
    assert job is not None
    lid = job["lease_id"]
    ok = app_api.post_job(
        jid, "results", {"lease_id": lid, "batch_no": 0, "requests": wire([2, 3, 6])}
    )
    assert ok.status_code == 200 and ok.json()["accepted"] == 3, ok.text
    bad = app_api.post_job(jid, "results", {"lease_id": lid, "batch_no": 1, "requests": wire([7])})
    assert bad.status_code == 422, bad.text
    detail = bad.json()["detail"][0]
    assert detail["loc"] == ["body", "requests", 0, "index"]
    assert "outside 0..6" in detail["msg"] and "2 sessions of up to 3 turns" in detail["msg"]
    with app_api.sessions() as s:
        assert repo.get_run(s, rid) is not None
    assert sorted(r.index for r in _stored(app_api, rid)) == [2, 3, 6]


def _stored(api: Api, run_id: str) -> list[Any]:
    with session_scope(api.sessions) as s:
        return repo.load_records(s, run_id)


# ------------------------------------------------ lost requests: partial, never valid


def test_completion_declaring_more_than_was_stored_is_partial_and_never_valid(
    app_api: Api, tmp_path: Path
) -> None:
    out = app_api.create_run(num_prompts=6)
    jid, rid = out["job_id"], out["run_id"]
    job = app_api.lease(app_api.register())
    assert job is not None
    lid = job["lease_id"]
    body = {"lease_id": lid, "batch_no": 0, "requests": wire([0, 1, 2, 3])}
    assert app_api.post_job(jid, "results", body).status_code == 200
    done = {"lease_id": lid, "status": "succeeded", "total_batches": 1, "records": 6}
    assert app_api.post_job(jid, "complete", done).json()["state"] == "succeeded"
    detail = _run(app_api, rid)
    assert detail["run"]["status"] == "partial"
    assert detail["run"]["lost_requests"] == 2  # 6 recorded - 4 stored
    v = detail["report"]["validity"]
    assert v["valid"] is False and v["lost_requests"] == 2
    assert "2 of 6 requests the worker recorded were not stored" in v["notes"], v["notes"]
    _never_valid(app_api, rid, 2)


def _never_valid(api: Api, run_id: str, lost: int) -> None:
    """Every place the run is shown says it is not valid, and why."""
    with session_scope(api.sessions) as s:
        row = repo.get_run(s, run_id)
        assert row.lost_requests == lost
        assert row_verdict(row).word == "incomplete"
        run = run_dict(row)
    report = _run(api, run_id)["report"]
    card = validity_card(report_verdict(run, report))
    assert (card.value, card.tone) == ("incomplete", "bad")
    assert f"lost {lost} requests: sent but never stored" in card.detail
    listed = api.client.get("/api/v1/runs", headers=api.h(api.admin)).json()["items"]
    assert [r["lost_requests"] for r in listed if r["id"] == run_id] == [lost]
    runs = list_runs(api.sessions)
    issues = run_trust_issues(next(r for r in runs if r["id"] == run_id))
    assert any(f"lost {lost} requests" in i for i in issues), issues
    console = Console(record=True, width=200)
    render_runs(runs, console)
    assert f"incomplete: lost {lost}" in console.export_text()
    page = api.client.get(f"/runs/{run_id}", headers=api.h(api.admin))
    assert page.status_code == 200
    assert "incomplete" in page.text and f"lost {lost}" in page.text
    listing = api.client.get("/", headers=api.h(api.admin))
    assert "incomplete" in listing.text


def test_lost_worker_of_a_multi_turn_run_names_its_turns_and_counts_the_lost(
    app_api: Api,
) -> None:
    out = app_api.create_run(**MULTI, warmup_requests=1)
    jid, rid = out["job_id"], out["run_id"]
    job = app_api.lease(app_api.register())
    assert job is not None
    lid = job["lease_id"]
    progress = {"phase": "measure", "planned": 5, "sent": 5, "done": 3}  # 5 turns planned
    assert (
        app_api.post_job(jid, "heartbeat", {"lease_id": lid, "progress": progress}).status_code
        == 200
    )
    body = {"lease_id": lid, "batch_no": 0, "requests": wire([1, 2, 3])}  # 3 measured turns
    assert app_api.post_job(jid, "results", body).status_code == 200
    assert [e.outcome for e in _expire(app_api, jid)] == ["partial"]
    detail = _run(app_api, rid)
    notes = detail["report"]["validity"]["notes"]
    assert any("worker lost: 3 of 6 planned requests were stored" in n for n in notes), notes
    assert "2 requests the worker had sent (its last heartbeat) were not stored" in notes
    assert detail["run"]["status"] == "partial" and detail["run"]["lost_requests"] == 2
    _never_valid(app_api, rid, 2)


def test_cancelled_multi_turn_run_without_a_reported_plan_says_its_bound(app_api: Api) -> None:
    out = app_api.create_run(**MULTI)
    jid, rid = out["job_id"], out["run_id"]
    job = app_api.lease(app_api.register())
    assert job is not None
    lid = job["lease_id"]
    body = {"lease_id": lid, "batch_no": 0, "requests": wire([0, 1])}
    assert app_api.post_job(jid, "results", body).status_code == 200
    done = {"lease_id": lid, "status": "cancelled", "total_batches": 1, "records": 2}
    assert app_api.post_job(jid, "complete", done).json()["state"] == "cancelled"
    detail = _run(app_api, rid)
    notes = detail["report"]["validity"]["notes"]
    want = "cancelled: 2 of up to 6 planned requests (2 sessions of up to 3 turns) were stored"
    assert want in notes, notes
    # nothing lost; the run is cancelled, and says so (issue 24), not "valid"
    assert detail["run"]["lost_requests"] == 0 and detail["run"]["status"] == "cancelled"
    assert detail["report"]["validity"]["verdict"] == "cancelled"


# --------------------------------------------------------- the worker, end to end


def _worker(srv: Any, tmp_path: Path, **kw: Any) -> Worker:
    opts = dataclasses.replace(FAST, dataset_dirs=(str(tmp_path),), **kw)
    return Worker(srv.url, srv.worker_token, state_dir=tmp_path / "state", name="w", options=opts)


@pytest.mark.slow  # the packaged ShareGPT file is read whole (about 5 s per process)
def test_multi_turn_sharegpt_through_rest_and_a_worker_keeps_every_turn(
    live_server: LiveServerFactory,  # noqa: F811
    db_url: str,
    sim: SimulatorThread,
    tmp_path: Path,
) -> None:
    """The issue's case: 8 ShareGPT sessions of up to 3 turns launched over REST. Before
    the fix the server refused every batch past index 7 and the worker dropped them: the
    target answered 21 turns, 1 was stored, and the run read "partial", valid."""
    srv = live_server(db_url)
    spec = {
        "base_url": sim.base_url,
        "model": "tokentrace-sim",
        "dataset": "sharegpt",
        "multi_turn": True,
        "max_turns": 3,
        "num_prompts": 8,
        "output_len": 4,
        "max_concurrency": 4,
    }
    with api(srv) as c:
        run_id, job_id = submit(c, spec)
        outcome = asyncio.run(_worker(srv, tmp_path).run_once())
        assert outcome is not None and outcome.status == "succeeded", outcome
        j = wait_job(c, job_id, ("succeeded",), 10)
        detail = c.get(f"/runs/{run_id}").json()
        stored = request_indices(c, run_id)
    seen = _seen(sim, run_id)
    counts = detail["report"]["load"]["counts"]
    assert seen == len(stored) == counts["sent"] == counts["planned"] > 8  # turns, not sessions
    assert sorted(stored) == list(range(seen))
    assert j["progress"]["planned"] == counts["planned"]  # the planned figure counts turns
    assert detail["run"]["status"] == "succeeded" and detail["run"]["lost_requests"] == 0
    assert detail["report"]["validity"]["lost_requests"] == 0


def test_a_refused_batch_fails_the_job_keeps_the_spool_and_recover_stores_it(
    live_server: LiveServerFactory,  # noqa: F811
    db_url: str,
    sim: SimulatorThread,
    tmp_path: Path,
) -> None:
    """A server that refuses every batch (here: over its upload limit, 413): the job fails
    with that reason, the run counts every request lost and is not valid, the worker keeps
    the batches in kept/, and ``tokentrace recover`` stores them into the run (twice:
    nothing twice)."""
    srv = live_server(db_url, env={"TOKENTRACE_MAX_UPLOAD_BYTES": "300"})
    spec = {
        "base_url": sim.base_url,
        "model": "tokentrace-sim",
        "input_len": 8,
        "output_len": 4,
        "num_prompts": 6,
        "max_concurrency": 2,
    }
    with api(srv) as c:
        run_id, job_id = submit(c, spec)
        outcome = asyncio.run(_worker(srv, tmp_path).run_once())
        assert outcome is not None and outcome.status == "failed", outcome
        j = wait_job(c, job_id, ("failed",), 10)
        detail = c.get(f"/runs/{run_id}").json()
    seen = _seen(sim, run_id)
    assert seen > 0
    assert "the server refused result batch 0 (5 times)" in j["error"], j["error"]
    assert "413" in j["error"] and "kept in the worker's spool" in j["error"]
    run = detail["run"]
    assert run["status"] == "failed" and run["lost_requests"] == seen  # nothing was stored
    assert detail["report"]["validity"]["valid"] is False
    assert any("refused result batch 0" in n for n in detail["report"]["validity"]["notes"])
    # the worker kept every batch it could not send, and removed nothing
    state = tmp_path / "state"
    assert list((state / "jobs").iterdir()) == []
    [kept] = Spool(state).kept()
    assert kept.job.job_id == job_id
    note = json.loads((kept.path / "kept.json").read_text())
    assert note["run_id"] == run_id and note["batches"] == kept.pending() != []
    recorded = sum(
        len(json.loads(kept.path.joinpath(f"batch-{n:06d}.json").read_text())["requests"])
        for n in kept.pending()
    )
    assert recorded == seen
    # recovered afterwards, straight into the database (no upload limit on that path)
    assert cli_main(["recover", str(kept.path), "--database-url", db_url]) == 0
    assert cli_main(["recover", str(kept.path), "--database-url", db_url]) == 0  # idempotent
    with api(srv) as c:
        detail = c.get(f"/runs/{run_id}").json()
        stored = request_indices(c, run_id)
    assert sorted(stored) == list(range(seen))
    assert detail["run"]["lost_requests"] == 0
    assert any(f"recovered {seen} requests" in n for n in detail["report"]["validity"]["notes"])
    assert detail["report"]["metrics"]["requests"]["completed_ok"] == seen


def test_recover_refuses_an_attempt_the_job_did_not_end_on(app_api: Api, tmp_path: Path) -> None:
    out = app_api.create_run(num_prompts=4)
    jid = out["job_id"]
    job = app_api.lease(app_api.register())
    assert job is not None
    assert [e.outcome for e in _expire(app_api, jid)] == ["requeued"]  # nothing uploaded
    spool = Spool(tmp_path / "state").open_job(LeasedJob.model_validate(job))
    from app.protocol.wire import ResultBatch, WireRequest

    spool.write(
        ResultBatch(
            lease_id=job["lease_id"], batch_no=0, requests=[WireRequest.from_record(record(0))]
        )
    )
    job2 = app_api.lease(app_api.register())
    assert job2 is not None and job2["attempt"] == 2
    body = {"lease_id": job2["lease_id"], "batch_no": 0, "requests": wire([0, 1, 2, 3])}
    assert app_api.post_job(jid, "results", body).status_code == 200
    done = {"lease_id": job2["lease_id"], "status": "succeeded", "total_batches": 1, "records": 4}
    assert app_api.post_job(jid, "complete", done).status_code == 200
    assert cli_main(["recover", str(spool.path), "--database-url", app_api.db_url]) == 1


def test_a_lost_lease_keeps_the_batches_not_yet_sent(tmp_path: Path) -> None:
    """The server answers 409 (lease lost) to every upload: the batch is not deleted but
    kept, with why."""

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(409, json={"detail": "lease lost: job j1 is failed"})

    import datetime as dt

    leased = LeasedJob(
        job_id="j1",
        kind="bench",
        spec={},
        run_id="r1",
        attempt=1,
        lease_id="l1",
        lease_expires_at=dt.datetime.now(dt.UTC),
    )

    async def go() -> Any:
        client = WorkerClient("http://server", "t", transport=httpx.MockTransport(answer))
        spool = Spool(tmp_path / "state").open_job(leased)
        jr = JobRun(client, spool, JobOptions(backoff_initial_s=0.01), asyncio.Event())
        jr.uploader.backoff = Backoff(0.01, 0.02)
        jr.uploader.start()
        await jr.uploader.add([record(0), record(1)])
        while jr.uploader.lost is None:
            await asyncio.sleep(0.01)
        await jr.uploader.close()
        out = jr.drop(jr.uploader.lost)
        await client.aclose()
        return out

    outcome = asyncio.run(go())
    assert outcome.status is None and "kept at" in (outcome.detail or "")
    [kept] = Spool(tmp_path / "state").kept()
    assert kept.pending() == [0]
    assert "lease lost" in json.loads((kept.path / "kept.json").read_text())["reason"]
    assert list((tmp_path / "state" / "jobs").iterdir()) == []


def test_bench_server_exits_1_for_a_run_that_lost_requests(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    sim: SimulatorThread,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``tokentrace bench --server`` follows the run to its end: lost requests are exit 1."""
    srv = live_server(sqlite_url, env={"TOKENTRACE_MAX_UPLOAD_BYTES": "300"})
    stop = threading.Event()
    w = _worker(srv, tmp_path)

    async def serve() -> None:
        ev = asyncio.Event()
        task = asyncio.create_task(w.run_forever(ev))
        while not stop.is_set():
            await asyncio.sleep(0.05)
        ev.set()
        await task

    t = threading.Thread(target=lambda: asyncio.run(serve()))
    t.start()
    try:
        args = ["bench", "--server", srv.url, "--token", srv.admin_token, "--json"]
        args += ["--base-url", sim.base_url, "--model", "tokentrace-sim", "--num-prompts", "3"]
        args += ["--input-len", "8", "--output-len", "4"]
        rc = cli_main(args)
    finally:
        stop.set()
        t.join(20)
    report = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert report["validity"]["lost_requests"] == 3 and report["validity"]["valid"] is False


def _conversations(tmp_path: Path) -> str:
    path = tmp_path / "conversations.jsonl"
    turns = [["a b c d", "e f g h", "i j k l"], ["m n o p", "q r s t"]]
    path.write_text("\n".join(json.dumps({"turns": t}) for t in turns) + "\n")
    return str(path)


def test_multi_turn_sweep_steps_keep_every_turn(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    sim: SimulatorThread,
    tmp_path: Path,
) -> None:
    """A sweep's batches are bounded by the same rule: each step of a multi-turn sweep
    stores every turn the simulator served for it."""
    srv = live_server(sqlite_url)
    body = {"base_url": sim.base_url, "model": "tokentrace-sim", "dataset": "jsonl",
            "dataset_path": _conversations(tmp_path), "multi_turn": True, "num_prompts": 4,
            "output_len": 4, "concurrencies": [1, 2]}  # fmt: skip
    with api(srv) as c:
        r = c.post("/sweeps", json=body)
        assert r.status_code == 201, r.text
        sweep_id, job_id = r.json()["sweep_id"], r.json()["job_id"]
        outcome = asyncio.run(_worker(srv, tmp_path).run_once())
        assert outcome is not None and outcome.status == "succeeded", outcome
        wait_job(c, job_id, ("succeeded",), 10)
        steps = c.get(f"/sweeps/{sweep_id}").json()["steps"]
        assert len(steps) == 2
        for s in steps:
            stored = request_indices(c, s["run_id"])
            assert len(stored) == _seen(sim, s["run_id"]) == 10  # 4 sessions: 3+2+3+2 turns
            assert sorted(stored) == list(range(10))


def test_a_refused_batch_fails_a_sweep_and_keeps_its_batches(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    sim: SimulatorThread,
    tmp_path: Path,
) -> None:
    srv = live_server(sqlite_url, env={"TOKENTRACE_MAX_UPLOAD_BYTES": "300"})
    body = {"base_url": sim.base_url, "model": "tokentrace-sim", "input_len": 8,
            "output_len": 4, "num_prompts": 4, "concurrencies": [1, 2]}  # fmt: skip
    with api(srv) as c:
        r = c.post("/sweeps", json=body)
        assert r.status_code == 201, r.text
        sweep_id, job_id = r.json()["sweep_id"], r.json()["job_id"]
        outcome = asyncio.run(_worker(srv, tmp_path).run_once())
        assert outcome is not None and outcome.status == "failed", outcome
        j = wait_job(c, job_id, ("failed",), 10)
        sweep = c.get(f"/sweeps/{sweep_id}").json()
        [step] = sweep["steps"]  # the sweep stopped at the step whose batch was refused
        run = c.get(f"/runs/{step['run_id']}").json()
    assert "the server refused result batch 0 (5 times)" in j["error"], j["error"]
    assert "the server refused result batch 0" in (sweep["stop_reason"] or "")
    seen = _seen(sim, step["run_id"])
    assert seen > 0 and run["run"]["lost_requests"] == seen
    assert run["report"]["validity"]["valid"] is False
    [kept] = Spool(tmp_path / "state").kept()
    assert kept.job.job_id == job_id and kept.pending()
