"""Sweeps on workers (job kind ``sweep``) against the real server and the simulator: end to
end with every step, early stop at saturation, cancel mid-sweep, the step protocol's
idempotency; and the roofline note and hardware in the comparability key."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.analysis import roofline as rl
from app.analysis.comparability import check
from app.analysis.model_presets import ModelConfig
from app.analysis.sweep import LoadKind, StepSummary
from app.client import sweep_plan
from app.client.spec import RunSpec
from app.protocol.wire import GPUInfo, RegisterRequest, ResumedStep, WireRequest, WorkerCapabilities
from app.services import compare as compare_svc
from app.services import hardware
from app.services import probes as probe_svc
from app.services import sweeps as sweep_svc
from app.services.runs import open_database
from app.settings import Settings
from app.storage import repository as repo
from app.storage.db import session_scope
from app.storage.jsonsafe import json_safe
from app.storage.models_probes import RunAnnotation
from app.targets.sim_config import SimConfig
from app.targets.simulator import SimulatorThread, start_simulator_thread
from app.worker.job import JobOutcome
from app.worker.loop import Worker, WorkerOptions
from app.worker.sweep_job import Replay, ReplayMismatch
from tests.live_server import (  # noqa: F401
    LiveServer,
    LiveServerFactory,
    free_port,
    live_server,
)
from tests.web_support import bench
from tests.worker_helpers import (
    api,
    request_indices,
    sim_spec,
    start_worker_process,
    wait_for,
    wait_job,
)

pytestmark = pytest.mark.timeout(90)

FAST = WorkerOptions(
    backoff_initial_s=0.05,
    backoff_max_s=0.5,
    batch_interval_s=0.2,
    batch_max_requests=8,
    shutdown_grace_s=3.0,
    heartbeat_interval_s=0.2,
    poll_interval_s=0.1,
)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorThread]:
    # per-token time grows 3 ms per active stream: a few tens of req/s saturate it
    s = start_simulator_thread(
        SimConfig(ttft_ms=5, itl_ms=1.0, itl_per_active_ms=3.0, output_len=4, seed=4)
    )
    yield s
    s.stop()


def make_worker(srv: LiveServer, tmp_path: Path, name: str = "w") -> Worker:
    return Worker(
        srv.url, srv.worker_token, state_dir=tmp_path / f"state-{name}", name=name, options=FAST
    )


def sweep_body(sim: SimulatorThread, **kw: Any) -> dict[str, Any]:
    base = sim_spec(sim.base_url, num_prompts=12, output_len=4, arrival="constant")
    base.pop("max_concurrency")
    return base | kw


def create(c: Any, body: dict[str, Any]) -> tuple[str, str]:
    r = c.post("/sweeps", json=body)
    assert r.status_code == 201, r.text
    return r.json()["sweep_id"], r.json()["job_id"]


def test_sweep_job_end_to_end(
    live_server: LiveServerFactory,  # noqa: F811
    db_url: str,
    sim: SimulatorThread,
    tmp_path: Path,
) -> None:
    srv = live_server(db_url)
    with api(srv) as c:
        sweep_id, job_id = create(c, sweep_body(sim, rates=[4, 8], name="sw", tags=["t1"]))
        assert c.get(f"/jobs/{job_id}").json()["kind"] == "sweep"
        assert c.get(f"/sweeps/{sweep_id}").json()["status"] == "queued"
        outcome = asyncio.run(make_worker(srv, tmp_path).run_once())
        assert outcome is not None and outcome.status == "succeeded", outcome
        j = wait_job(c, job_id, ("succeeded",), 10)
        assert "api_key" not in j["spec"]
        summary = c.get(f"/sweeps/{sweep_id}").json()
        assert summary["status"] == "succeeded" and summary["stop_reason"] is None
        assert [s["load"] for s in summary["steps"]] == [4.0, 8.0]
        assert all(s["status"] == "succeeded" for s in summary["steps"])
        for s in summary["steps"]:
            assert sorted(request_indices(c, s["run_id"])) == list(range(12))
            run = c.get(f"/runs/{s['run_id']}").json()
            assert run["run"]["tags"] == ["t1"] and run["run"]["name"].startswith("sw · ")
            worker = run["report"]["load"]["worker"]  # who ran it, for the hardware key
            assert worker["hostname"] and worker["gpus"] == []
        page = httpx_get(srv, f"/sweeps/{sweep_id}")
        assert 'id="steps-table"' in page
        assert all(s["run_id"] in page for s in summary["steps"])


def httpx_get(srv: LiveServer, path: str) -> str:
    import httpx

    r = httpx.get(
        srv.url + path, headers={"Authorization": f"Bearer {srv.admin_token}"}, trust_env=False
    )
    assert r.status_code == 200, r.text
    return r.text


@pytest.fixture
def server(live_server: LiveServerFactory, sqlite_url: str) -> LiveServer:  # noqa: F811
    return live_server(sqlite_url)


def test_sweep_job_stops_early_at_saturation(
    server: LiveServer, sim: SimulatorThread, tmp_path: Path
) -> None:
    with api(server) as c:
        sweep_id, _ = create(c, sweep_body(sim, num_prompts=20, rates=[10, 300, 600]))
        outcome = asyncio.run(make_worker(server, tmp_path).run_once())
        assert outcome is not None and outcome.status == "succeeded", outcome
        summary = c.get(f"/sweeps/{sweep_id}").json()
    assert [s["load"] for s in summary["steps"]] == [10.0, 300.0]  # 600 never ran
    assert summary["stop_reason"].startswith("stopped early: achieved")
    assert "saturated" in summary["stop_reason"]


def test_sweep_job_validation(server: LiveServer, sim: SimulatorThread) -> None:
    with api(server) as c:
        r = c.post("/sweeps", json=sweep_body(sim, rates=[8, 4]))
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "rates"]
        r = c.post("/sweeps", json=sweep_body(sim, rates=[4], auto=True))
        assert r.status_code == 422
        r = c.post("/sweeps", json=sweep_body(sim, concurrencies=[0, 2]))
        assert r.status_code == 422 and "concurrencies" in r.text
        r = c.post("/sweeps", json=sweep_body(sim, auto=True, auto_steps=0))
        assert r.status_code == 422 and "auto_steps" in r.text
        assert c.get("/sweeps").json() == []  # nothing was stored


def test_cancel_mid_sweep_keeps_finished_steps(
    server: LiveServer, sim: SimulatorThread, tmp_path: Path
) -> None:
    body = sweep_body(sim, num_prompts=40, rates=[20, 21, 22])
    box: dict[str, JobOutcome | None] = {}
    with api(server) as c:
        sweep_id, job_id = create(c, body)
        w = make_worker(server, tmp_path)
        t = threading.Thread(target=lambda: box.update(o=asyncio.run(w.run_once())))
        t.start()

        def second_step_running() -> bool:
            prog = c.get(f"/jobs/{job_id}").json().get("progress") or {}
            return bool(prog.get("step") == 1 and prog.get("steps") == 3)

        wait_for(second_step_running, 30, "step 2 of 3")
        r = c.post(f"/sweeps/{sweep_id}/cancel")
        assert r.status_code == 200 and r.json()["cancel_requested"], r.text
        t.join(30)
        assert not t.is_alive()
        assert box["o"] is not None and box["o"].status == "cancelled"
        wait_job(c, job_id, ("cancelled",), 10)
        summary = c.get(f"/sweeps/{sweep_id}").json()
        assert c.post(f"/sweeps/{sweep_id}/cancel").status_code == 409
    assert summary["status"] == "cancelled" and "cancelled" in summary["stop_reason"]
    steps = summary["steps"]
    assert len(steps) == 2  # the third never started
    assert steps[0]["status"] == "succeeded"
    assert steps[1]["status"] in ("partial", "cancelled")


def _register(c: Any, gpus: list[str] | None = None, token: str | None = None) -> str:
    caps = WorkerCapabilities(
        hostname="box",
        tokentrace_version="t",
        gpus=[GPUInfo(index=i, name=n) for i, n in enumerate(gpus or [])],
    )
    body = RegisterRequest(name="manual", capabilities=caps).model_dump(mode="json")
    r = c.post("/workers/register", json=body, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    wid: str = r.json()["worker_id"]
    return wid


def _wire(i: int, t0: int) -> dict[str, Any]:
    from app.domain import RequestRecord, RequestStatus

    rec = RequestRecord(
        index=i, scheduled_ns=t0, sent_ns=t0, end_ns=t0 + 5_000_000, status=RequestStatus.OK,
        input_tokens=4, output_tokens=1,
    )  # fmt: skip
    return WireRequest.from_record(rec).model_dump(mode="json")


def test_step_protocol_is_idempotent(
    live_server: LiveServerFactory,  # noqa: F811
    db_url: str,
    sim: SimulatorThread,
) -> None:
    srv = live_server(db_url)
    w = {"Authorization": f"Bearer {srv.worker_token}"}
    with api(srv) as c:
        sweep_id, job_id = create(c, sweep_body(sim, num_prompts=3, rates=[5, 6]))
        wid = _register(c, ["NVIDIA H100 80GB HBM3"], srv.worker_token)
        leased = c.post(f"/workers/{wid}/lease", json={"kinds": ["sweep"]}, headers=w).json()
        job = leased["job"]
        assert job["job_id"] == job_id and job["kind"] == "sweep" and job["run_id"] is None
        lease = job["lease_id"]
        step = {"lease_id": lease, "step_idx": 0, "load": 5, "load_kind": "rate"}
        first = c.post(f"/jobs/{job_id}/steps", json=step, headers=w)
        again = c.post(f"/jobs/{job_id}/steps", json=step, headers=w)
        assert first.status_code == 200 and again.json() == first.json()
        run_id = first.json()["run_id"]
        batch = {"lease_id": lease, "batch_no": 0, "run_id": run_id,
                 "requests": [_wire(i, 1_000_000 * (i + 1)) for i in range(3)]}  # fmt: skip
        a1 = c.post(f"/jobs/{job_id}/results", json=batch, headers=w).json()
        a2 = c.post(f"/jobs/{job_id}/results", json=batch, headers=w).json()
        assert (a1["accepted"], a1["duplicate"]) == (3, False)
        assert (a2["accepted"], a2["duplicate"]) == (0, True)
        assert sorted(request_indices(c, run_id)) == [0, 1, 2]  # nothing stored twice
        wrong = batch | {"batch_no": 1, "run_id": "nope"}
        bad = c.post(f"/jobs/{job_id}/results", json=wrong, headers=w)
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "run_id"]
        done = {"lease_id": lease, "status": "succeeded", "total_batches": 2}
        missing = c.post(f"/jobs/{job_id}/steps/0/complete", json=done, headers=w)
        assert missing.status_code == 409 and "batches missing: [1]" in missing.text
        done["total_batches"] = 1
        s1 = c.post(f"/jobs/{job_id}/steps/0/complete", json=done, headers=w)
        s2 = c.post(f"/jobs/{job_id}/steps/0/complete", json=done, headers=w)
        assert s1.status_code == 200 and s1.json()["status"] == "succeeded", s1.text
        assert s2.json()["summary"] == s1.json()["summary"]
        assert s1.json()["summary"]["load"] == 5.0
        end = {"lease_id": lease, "status": "succeeded", "total_batches": 1,
               "stop_reason": "stopped early: test"}  # fmt: skip
        r = c.post(f"/jobs/{job_id}/complete", json=end, headers=w)
        assert r.status_code == 200 and r.json()["state"] == "succeeded", r.text
        summary = c.get(f"/sweeps/{sweep_id}").json()
        assert summary["status"] == "succeeded" and summary["stop_reason"] == "stopped early: test"
        assert len(summary["steps"]) == 1
        run = c.get(f"/runs/{run_id}").json()
        assert run["report"]["load"]["worker"]["gpus"] == ["NVIDIA H100 80GB HBM3"]
        late = c.post(f"/jobs/{job_id}/steps", json=step | {"step_idx": 1}, headers=w)
        assert late.status_code == 409  # the lease is over


def test_lost_sweep_lease_keeps_steps_and_marks_partial(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    sim: SimulatorThread,
) -> None:
    """With no attempt left (max_attempts 1) a lost sweep ends partial, its steps kept."""
    env = {"TOKENTRACE_LEASE_TTL_S": "1", "TOKENTRACE_MAX_ATTEMPTS": "1"}
    srv = live_server(sqlite_url, env=env)
    w = {"Authorization": f"Bearer {srv.worker_token}"}
    with api(srv) as c:
        sweep_id, job_id = create(c, sweep_body(sim, num_prompts=3, rates=[5, 6]))
        wid = _register(c, None, srv.worker_token)
        lease = c.post(f"/workers/{wid}/lease", json={"kinds": ["sweep"]}, headers=w).json()
        lease_id = lease["job"]["lease_id"]
        step = {"lease_id": lease_id, "step_idx": 0, "load": 5, "load_kind": "rate"}
        run_id = c.post(f"/jobs/{job_id}/steps", json=step, headers=w).json()["run_id"]
        batch = {"lease_id": lease_id, "batch_no": 0, "run_id": run_id,
                 "requests": [_wire(0, 1_000_000)]}  # fmt: skip
        assert c.post(f"/jobs/{job_id}/results", json=batch, headers=w).status_code == 200

        def expired() -> bool:  # a lease call sweeps expired leases
            c.post(f"/workers/{wid}/lease", json={"kinds": ["bench"]}, headers=w)
            return bool(c.get(f"/jobs/{job_id}").json()["state"] == "failed")

        wait_for(expired, 15, "the lease to expire", poll_s=0.3)
        summary = c.get(f"/sweeps/{sweep_id}").json()
        assert summary["status"] == "partial" and "worker lost" in summary["stop_reason"]
        assert [s["status"] for s in summary["steps"]] == ["partial"]
        assert request_indices(c, run_id) == [0]


# ------------------------------------------------------------- lost workers: resume


def _manual_step(
    c: Any, w: dict[str, str], job_id: str, lease_id: str, idx: int, load: float, batch_no: int
) -> str:
    """Create step ``idx`` at ``load`` and upload one 3-request batch to its run."""
    step = {"lease_id": lease_id, "step_idx": idx, "load": load, "load_kind": "rate"}
    r = c.post(f"/jobs/{job_id}/steps", json=step, headers=w)
    assert r.status_code == 200, r.text
    run_id: str = r.json()["run_id"]
    batch = {"lease_id": lease_id, "batch_no": batch_no, "run_id": run_id,
             "requests": [_wire(i, 1_000_000 * (i + 1)) for i in range(3)]}  # fmt: skip
    r = c.post(f"/jobs/{job_id}/results", json=batch, headers=w)
    assert r.status_code == 200 and r.json()["accepted"] == 3, r.text
    return run_id


def _run_notes(c: Any, run_id: str) -> tuple[str, list[str]]:
    """A run's status and its validity notes."""
    body = c.get(f"/runs/{run_id}").json()
    return body["run"]["status"], list(body["report"]["validity"]["notes"])


def _expire(c: Any, w: dict[str, str], wid: str, job_id: str) -> dict[str, Any]:
    def requeued() -> bool:  # a lease call sweeps expired leases
        c.post(f"/workers/{wid}/lease", json={"kinds": ["bench"]}, headers=w)
        return bool(c.get(f"/jobs/{job_id}").json()["state"] == "queued")

    wait_for(requeued, 15, "the lease to expire and the job to be requeued", poll_s=0.3)
    out: dict[str, Any] = c.get(f"/jobs/{job_id}").json()
    return out


def test_lost_sweep_is_requeued_and_resumed_over_the_protocol(
    live_server: LiveServerFactory,  # noqa: F811
    db_url: str,
    sim: SimulatorThread,
) -> None:
    """Attempt 1 completes step 0 and is lost during step 1: the job is requeued, the
    sweep queued; attempt 2's lease hands over step 0 (with the summary its worker got) and
    the first batch number to use; step 1 gets a new run; the old one is kept apart."""
    srv = live_server(db_url, env={"TOKENTRACE_LEASE_TTL_S": "1"})
    w = {"Authorization": f"Bearer {srv.worker_token}"}
    with api(srv) as c:
        sweep_id, job_id = create(c, sweep_body(sim, num_prompts=3, rates=[5, 6]))
        wid = _register(c, None, srv.worker_token)
        lease1 = c.post(f"/workers/{wid}/lease", json={"kinds": ["sweep"]}, headers=w).json()
        l1 = lease1["job"]["lease_id"]
        assert lease1["job"]["attempt"] == 1 and lease1["job"]["resume"] is None
        run0 = _manual_step(c, w, job_id, l1, 0, 5, 0)
        done = {"lease_id": l1, "status": "succeeded", "total_batches": 1}
        s0 = c.post(f"/jobs/{job_id}/steps/0/complete", json=done, headers=w).json()
        old1 = _manual_step(c, w, job_id, l1, 1, 6, 1)  # the worker is lost during step 1
        j = _expire(c, w, wid, job_id)
        assert j["attempt"] == 1 and "requeued to resume" in j["error"]
        queued = c.get(f"/sweeps/{sweep_id}").json()
        assert queued["status"] == "queued" and queued["stop_reason"] is None
        assert [s["status"] for s in queued["steps"]] == ["succeeded", "partial"]
        _, notes = _run_notes(c, old1)
        assert any("re-runs this step" in n for n in notes), notes

        lease2 = c.post(f"/workers/{wid}/lease", json={"kinds": ["sweep"]}, headers=w).json()
        job2 = lease2["job"]
        l2 = job2["lease_id"]
        assert job2["attempt"] == 2
        assert job2["resume"]["first_batch_no"] == 2
        [kept] = job2["resume"]["completed"]
        assert (kept["step_idx"], kept["run_id"], kept["load"]) == (0, run0, 5.0)
        assert (kept["load_kind"], kept["role"]) == ("rate", "step")
        assert kept["summary"] == s0["summary"]  # exactly what attempt 1's worker was told
        again = c.post(f"/jobs/{job_id}/steps/0/complete", json=done | {"lease_id": l2},
                       headers=w)  # fmt: skip
        assert again.json()["summary"] == s0["summary"]
        redo = {"lease_id": l2, "step_idx": 0, "load": 5, "load_kind": "rate"}
        r = c.post(f"/jobs/{job_id}/steps", json=redo, headers=w)
        assert r.status_code == 422 and "replay it" in r.text  # completed: never re-run
        stale = {"lease_id": l2, "batch_no": 1, "run_id": run0, "requests": [_wire(0, 1)]}
        r = c.post(f"/jobs/{job_id}/results", json=stale, headers=w)
        assert r.status_code == 422 and "earlier attempts" in r.text
        new1 = _manual_step(c, w, job_id, l2, 1, 6, 2)
        assert new1 != old1
        step1 = {"lease_id": l2, "step_idx": 1, "load": 6, "load_kind": "rate"}
        assert c.post(f"/jobs/{job_id}/steps", json=step1, headers=w).json()["run_id"] == new1
        done2 = {"lease_id": l2, "status": "succeeded", "total_batches": 3}
        r = c.post(f"/jobs/{job_id}/steps/1/complete", json=done2, headers=w)
        assert r.status_code == 200 and r.json()["run_id"] == new1, r.text
        r = c.post(f"/jobs/{job_id}/complete", json=done2, headers=w)
        assert r.status_code == 200 and r.json()["state"] == "succeeded", r.text
        summary = c.get(f"/sweeps/{sweep_id}").json()
        old_status, notes = _run_notes(c, old1)
        assert request_indices(c, old1) == [0, 1, 2]  # kept, apart from the sweep
        assert sorted(request_indices(c, new1)) == [0, 1, 2]
        assert sorted(request_indices(c, run0)) == [0, 1, 2]
        page = httpx_get(srv, f"/sweeps/{sweep_id}")
    assert summary["status"] == "succeeded"
    assert [(s["run_id"], s["attempt"]) for s in summary["steps"]] == [(run0, 1), (new1, 2)]
    assert summary["notes"] == ["resumed after the worker was lost at step 1 (attempt 2)"]
    assert summary["notes"][0] in page
    assert old_status == "partial"
    assert any("superseded" in n and new1 in n for n in notes), notes


def _wait_step(
    c: Any, job_id: str, sweep_id: str, at_least: int, requests: int | None = None
) -> int:
    """Wait until a step >= ``at_least`` of the sweep is running (by the server's own step
    rows, not the job's progress, which lags by a heartbeat and stays as it was once the
    job ends) and has stored a request, and, given the step's ``requests``, not all of
    them yet (a step whose every request is stored may be ending); its index."""
    box: dict[str, int] = {}

    def running() -> bool:
        steps = c.get(f"/sweeps/{sweep_id}").json().get("steps") or []
        for st in steps:
            if st["index"] < at_least or st["status"] != "running" or not st.get("run_id"):
                continue
            stored = len(request_indices(c, st["run_id"]))
            if stored > 0 and (requests is None or stored < requests):
                box["step"] = int(st["index"])
                return True
        return False

    wait_for(running, 40, f"step {at_least} to store requests", poll_s=0.2)
    return box["step"]


def _kill(p: Any) -> None:
    if p.poll() is None:
        p.kill()
        p.wait(10)


def _lose_worker_during_step(
    srv: LiveServer,
    c: Any,
    tmp_path: Path,
    job_id: str,
    sweep_id: str,
    at_least: int,
    requests: int | None = None,
) -> dict[str, Any]:
    """A worker process runs the sweep and is SIGKILLed during step >= ``at_least`` (with
    ``requests`` per step: before that step stored them all); the job is requeued. Returns
    the sweep as the lost attempt left it."""
    proc = start_worker_process(srv.url, srv.worker_token, tmp_path / "w1", "--kind", "sweep")
    try:
        _wait_step(c, job_id, sweep_id, at_least, requests)
    finally:
        _kill(proc)
    wait_job(c, job_id, ("queued",), 40)  # the lease TTL, then the expiry sweep
    out: dict[str, Any] = c.get(f"/sweeps/{sweep_id}").json()
    return out


def test_sweep_resumes_after_its_worker_is_killed(
    live_server: LiveServerFactory,  # noqa: F811
    db_url: str,
    sim: SimulatorThread,
    tmp_path: Path,
) -> None:
    """A worker SIGKILLed after >= 2 of 4 steps: attempt 2 (another worker) re-runs nothing
    that completed, re-runs the interrupted step in a new run in its slot, and the sweep
    ends with exactly the planned steps, each request stored once."""
    # a step's finalize may hold the server a few seconds: heartbeats must not lose the lease
    srv = live_server(db_url, env={"TOKENTRACE_LEASE_TTL_S": "10"})
    rates = [5.0, 6.0, 7.0, 8.0]
    with api(srv) as c:
        sweep_id, job_id = create(c, sweep_body(sim, num_prompts=20, rates=rates))
        lost = _lose_worker_during_step(srv, c, tmp_path, job_id, sweep_id, 2, requests=20)
        kept = [s for s in lost["steps"] if s["status"] == "succeeded"]
        interrupted = [s for s in lost["steps"] if s["status"] != "succeeded"]
        assert len(kept) >= 2 and len(interrupted) == 1, lost["steps"]
        k, old_run = len(kept), interrupted[0]["run_id"]
        old_requests = request_indices(c, old_run)
        outcome = asyncio.run(make_worker(srv, tmp_path, "w2").run_once())
        assert outcome is not None and outcome.status == "succeeded", outcome
        j = wait_job(c, job_id, ("succeeded",), 10)
        summary = c.get(f"/sweeps/{sweep_id}").json()
        counts = {s["run_id"]: request_indices(c, s["run_id"]) for s in summary["steps"]}
        old_status, notes = _run_notes(c, old_run)
        after_old = request_indices(c, old_run)
    assert j["attempt"] == 2 and summary["status"] == "succeeded"
    assert summary["stop_reason"] is None
    assert [s["load"] for s in summary["steps"]] == rates  # exactly the planned steps
    assert all(s["status"] == "succeeded" for s in summary["steps"])
    runs = [s["run_id"] for s in summary["steps"]]
    assert runs[:k] == [s["run_id"] for s in kept]  # completed steps: never re-run
    assert old_run not in runs and len(set(runs)) == 4
    for rid, idx in counts.items():
        assert sorted(idx) == list(range(20)), rid  # each request once
    assert [s["attempt"] for s in summary["steps"]] == [1] * k + [2] * (4 - k)
    assert summary["notes"] == [f"resumed after the worker was lost at step {k} (attempt 2)"]
    # the interrupted run stays on its own, with what it had stored and why
    assert old_status in ("partial", "failed") and after_old == old_requests
    assert len(after_old) == len(set(after_old)) >= 1
    assert any("superseded" in n and runs[k] in n for n in notes), notes


def test_auto_sweep_resumed_chooses_the_same_loads(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    sim: SimulatorThread,
    tmp_path: Path,
) -> None:
    """An auto sweep lost after its two probes: attempt 2 replays the probes' stored
    summaries and so chooses the rates attempt 1 chose (not re-measured ones)."""
    srv = live_server(sqlite_url, env={"TOKENTRACE_LEASE_TTL_S": "10"})
    with api(srv) as c:
        body = sweep_body(sim, num_prompts=100, auto=True, auto_steps=3)
        sweep_id, job_id = create(c, body)
        lost = _lose_worker_during_step(srv, c, tmp_path, job_id, sweep_id, 2)
        chosen = lost["loads"]  # the rates attempt 1 chose from its probes
        kept = [s for s in lost["steps"] if s["status"] == "succeeded"]
        assert len(chosen) == 3 and len(kept) >= 2, lost
        outcome = asyncio.run(make_worker(srv, tmp_path, "w2").run_once())
        assert outcome is not None and outcome.status == "succeeded", outcome
        summary = c.get(f"/sweeps/{sweep_id}").json()
    steps = summary["steps"]
    assert summary["status"] == "succeeded" and summary["loads"] == chosen
    assert [s["run_id"] for s in steps[: len(kept)]] == [s["run_id"] for s in kept]
    assert [s["role"] for s in steps[:2]] == ["probe", "probe"]
    rated = [s["load"] for s in steps[2:]]
    assert rated == chosen[: len(rated)] and rated  # the same rates, in order
    if len(rated) < 3:
        assert summary["stop_reason"].startswith("stopped early")


def test_resume_with_a_different_plan_fails_naming_the_step(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    sim: SimulatorThread,
    tmp_path: Path,
) -> None:
    """The completed step stored (7 req/s) is not what the plan asks for at step 0 (5):
    the resuming worker fails the job instead of re-running anything."""
    srv = live_server(sqlite_url, env={"TOKENTRACE_LEASE_TTL_S": "1"})
    w = {"Authorization": f"Bearer {srv.worker_token}"}
    with api(srv) as c:
        sweep_id, job_id = create(c, sweep_body(sim, num_prompts=3, rates=[5, 6]))
        wid = _register(c, None, srv.worker_token)
        lease = c.post(f"/workers/{wid}/lease", json={"kinds": ["sweep"]}, headers=w).json()
        lease_id = lease["job"]["lease_id"]
        run0 = _manual_step(c, w, job_id, lease_id, 0, 7, 0)
        done = {"lease_id": lease_id, "status": "succeeded", "total_batches": 1}
        assert c.post(f"/jobs/{job_id}/steps/0/complete", json=done, headers=w).status_code == 200
        _expire(c, w, wid, job_id)
        outcome = asyncio.run(make_worker(srv, tmp_path).run_once())
        assert outcome is not None and outcome.status == "failed", outcome
        j = wait_job(c, job_id, ("failed",), 10)
        summary = c.get(f"/sweeps/{sweep_id}").json()
    assert "step 0" in j["error"] and "7 req/s" in j["error"] and "5 req/s" in j["error"]
    assert summary["status"] == "partial" and "step 0" in summary["stop_reason"]
    assert [s["run_id"] for s in summary["steps"]] == [run0]  # nothing re-run


def _fake_step(i: int, load: float, kind: LoadKind) -> StepSummary:
    """A deterministic server: 40 req/s at most, latency growing with the load."""
    thr = min(load, 40.0) if math.isfinite(load) else 40.0
    if kind == "concurrency":
        thr = 12.5
    return StepSummary(
        index=i, load=load, load_kind=kind, achieved_rps=thr * 0.999999,
        request_throughput_rps=thr / 3, output_throughput_tok_s=thr * 17.3,
        goodput_rps=None, error_rate=0.0,
        latency_ms={"ttft_ms": {"p50": 1 / 3, "p90": None, "p99": load / 7 if
                                math.isfinite(load) else None}},
        run_id=f"r{i}",
    )  # fmt: skip


class _Live:
    """A sweep run uninterrupted against the fake server; keeps what the server stored."""

    def __init__(self) -> None:
        self.stored: list[ResumedStep] = []
        self.loads: list[float] = []

    def run(self, load: float, kind: LoadKind, role: str) -> StepSummary:
        s = _fake_step(len(self.stored), load, kind)
        wire = json.loads(json.dumps(json_safe(sweep_plan.step_dict(s, role))))
        self.stored.append(ResumedStep(step_idx=s.index, run_id=s.run_id or "",
                           load=wire["load"], load_kind=kind,
                           role="probe" if role == "probe" else "step", summary=wire))  # fmt: skip
        return sweep_plan.step_from_dict(wire)  # what the worker gets over HTTP

    def set_loads(self, loads: list[float]) -> None:
        self.loads = list(loads)


class _Resumed(_Live):
    """Attempt 2: the first steps come from ``Replay``, the rest run live."""

    def __init__(self, replay: Replay) -> None:
        super().__init__()
        self.replay = replay
        self.ran: list[int] = []

    def run(self, load: float, kind: LoadKind, role: str) -> StepSummary:
        idx = len(self.stored)
        done = self.replay.summary(idx, load, kind, role)
        if done is None:
            self.ran.append(idx)
            return super().run(load, kind, role)
        self.stored.append(self.replay.steps[idx])
        return done


@pytest.mark.parametrize(
    "plan",
    [
        sweep_plan.SweepPlan("auto", (), 4),
        sweep_plan.SweepPlan("rates", (10.0, 20.0, 35.0, 50.0, 80.0)),
    ],
    ids=["auto", "rates"],
)
def test_replay_through_drive_decides_as_the_uninterrupted_sweep(
    plan: sweep_plan.SweepPlan,
) -> None:
    whole = _Live()
    stop = sweep_plan.drive(whole, plan)
    steps = [(s.step_idx, s.load, s.load_kind, s.role) for s in whole.stored]
    assert len(steps) >= 4
    for k in range(len(steps) + 1):  # lost after k completed steps
        resumed = _Resumed(Replay(whole.stored[:k]))
        assert sweep_plan.drive(resumed, plan) == stop
        assert [(s.step_idx, s.load, s.load_kind, s.role) for s in resumed.stored] == steps
        assert resumed.ran == list(range(k, len(steps)))  # nothing completed is re-run
        assert resumed.loads == whole.loads  # auto: the same rates chosen


def test_replay_refuses_a_different_plan() -> None:
    whole = _Live()
    sweep_plan.drive(whole, sweep_plan.SweepPlan("rates", (10.0, 20.0)))
    with pytest.raises(ReplayMismatch, match=r"step 1 ran at 20 req/s \(step\).*25 req/s"):
        sweep_plan.drive(
            _Resumed(Replay(whole.stored)), sweep_plan.SweepPlan("rates", (10.0, 25.0))
        )
    with pytest.raises(ReplayMismatch, match="step 0"):
        sweep_plan.drive(
            _Resumed(Replay(whole.stored)), sweep_plan.SweepPlan("concurrencies", (10.0, 20.0))
        )


def test_step_summary_round_trips_exactly_through_storage() -> None:
    s = StepSummary(
        index=3, load=math.inf, load_kind="rate", achieved_rps=None,
        request_throughput_rps=0.1 + 0.2, output_throughput_tok_s=1e-300,
        goodput_rps=123456.789012345678, error_rate=0.0,
        latency_ms={"ttft_ms": {"p50": 1 / 3, "p90": None, "p99": 2.0**-40}}, run_id="r",
    )  # fmt: skip
    stored = json.loads(json.dumps(json_safe(sweep_plan.step_dict(s, "probe"))))
    assert sweep_plan.step_from_dict(stored) == s
    assert sweep_plan.step_from_dict(json.loads(json.dumps(stored))) == s


# ---------------------------------------------------------------- roofline and hardware

# an MoE model: its weight-read floor is active params x 2 bytes / bandwidth
H100_BW = 3.35e12


def _model(floor_ms: float) -> dict[str, Any]:
    active = int(floor_ms / 1e3 * H100_BW / 2)
    return ModelConfig(
        name="test-moe", params=active * 4, active_params=active, layers=4, hidden=64,
        heads=4, kv_heads=4, head_dim=16, intermediate=128, vocab=100,
    ).model_dump(mode="json")  # fmt: skip


def _annotate(url: str, run_id: str, floor_ms: float, device: str | None = "h100-sxm") -> None:
    with session_scope(open_database(url)) as s:
        ann = probe_svc.Annotation(
            model=ModelConfig.model_validate(_model(floor_ms)), device=device
        )
        probe_svc.annotate(s, run_id, ann)


def test_weight_read_floor() -> None:
    m = ModelConfig.model_validate(_model(20.0))
    assert rl.weight_read_floor_s(m, H100_BW) == pytest.approx(0.020, rel=1e-6)
    dense = ModelConfig(
        name="d", params=1, layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16,
        intermediate=128, vocab=0,
    )  # fmt: skip
    floor = rl.weight_read_floor_s(dense, 1e9)
    step = rl.step_cost(dense, "decode", batch=1, tokens=1).total
    assert floor == pytest.approx(step.bytes / 1e9)
    with pytest.raises(ValueError):
        rl.weight_read_floor_s(dense, 0)


@pytest.fixture(scope="module")
def annotated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two runs with TPOT ~20 ms and a one-step local sweep."""
    tmp = tmp_path_factory.mktemp("roof")
    url = f"sqlite:///{tmp / 'roof.db'}"
    sessions = open_database(url)
    # one port for every simulator started here: the runs measured one target
    cfg = SimConfig(ttft_ms=5, itl_ms=20.0, output_len=6, seed=1, port=free_port())
    kw: dict[str, Any] = {"num_prompts": 6, "output_len": 6, "request_rate": 100.0}
    a = bench(sessions, cfg, "a", **kw)
    b = bench(sessions, cfg, "b", **kw)
    sim = start_simulator_thread(cfg)
    try:
        spec = RunSpec(base_url=sim.base_url, model="tokentrace-sim", input_len=16, **kw)
        out = sweep_svc.execute_sweep(
            spec, sweep_plan.SweepPlan("rates", (50.0,)), sessions=sessions, name="roof"
        )
    finally:
        sim.stop()
    step_run = out.summary["steps"][0]["run_id"]
    return {"url": url, "a": a, "b": b, "sweep": out.sweep_id, "step": step_run}


NOTE = "decode is memory-bound"


def test_roofline_note_fires_on_run_sweep_and_compare_pages(annotated: dict[str, str]) -> None:
    url = annotated["url"]
    sessions = open_database(url)
    plain = compare_svc.load_samples(sessions, annotated["a"])
    assert plain.weight_floor_ms is None
    assert not any(NOTE in n["text"] for n in compare_svc.run_diagnosis(plain))
    tpot = plain.report["metrics"]["tpot_ms"]["p50"]
    assert 19 < tpot < 26, tpot
    _annotate(url, annotated["a"], tpot * 0.97)  # within 10% of the floor: fires
    _annotate(url, annotated["b"], tpot / 3)  # far above the floor: must not fire
    # the step's own TPOT (another run: on a loaded machine it differs from run a's)
    step_tpot = compare_svc.load_samples(sessions, annotated["step"]).report["metrics"]
    _annotate(url, annotated["step"], step_tpot["tpot_ms"]["p50"] * 0.97)
    rs = compare_svc.load_samples(sessions, annotated["a"])
    assert rs.weight_floor_ms == pytest.approx(tpot * 0.97, rel=1e-3)
    notes = [n["text"] for n in compare_svc.run_diagnosis(rs)]
    assert any(NOTE in t and "H100" in t for t in notes), notes
    far = compare_svc.load_samples(sessions, annotated["b"])
    assert not any("weight-read floor" in n["text"] for n in compare_svc.run_diagnosis(far))
    with TestClient(create_app_for(url)) as c:
        assert NOTE in c.get(f"/runs/{annotated['a']}").text
        assert NOTE not in c.get(f"/runs/{annotated['b']}").text
        assert NOTE in c.get(f"/sweeps/{annotated['sweep']}").text
        page = c.get(f"/compare?ids={annotated['a']}&ids={annotated['b']}")
        assert page.status_code == 200 and NOTE in page.text
        api_sweep = c.get(f"/api/v1/sweeps/{annotated['sweep']}").json()
        assert api_sweep["diagnosis"][0]["rule"] == "decode-memory-bound"


def create_app_for(url: str) -> Any:
    from app.api.app import create_app

    return create_app(Settings(database_url=url, local_worker=False))


def test_roofline_floor_from_measured_ceilings_of_the_worker_gpu(
    annotated: dict[str, str],
) -> None:
    from app.storage import probes as probe_repo

    url = annotated["url"]
    _annotate(url, annotated["b"], 20.0, device=None)  # a model, no device
    gpu = "NVIDIA Test GPU"
    with session_scope(open_database(url)) as s:
        stats = {"worker": {"id": "w", "name": "w", "hostname": "h", "gpus": [gpu]}}
        assert hardware.roofline_floor(s, annotated["b"], stats)[0] is None  # no bandwidth
        probe = probe_repo.create_probe(s, kind="ceilings", device="cuda", params={})
        probe_repo.finish_probe(
            s, probe, status="succeeded", fingerprint={"device_name": gpu},
            result={"ceilings": {"bandwidth_bps": H100_BW / 2}}, telemetry=None, error=None,
        )  # fmt: skip
        floor, label = hardware.roofline_floor(s, annotated["b"], stats)
    assert floor == pytest.approx(40.0, rel=1e-3) and gpu in label


def test_hardware_difference_is_flagged(annotated: dict[str, str]) -> None:
    url = annotated["url"]
    sessions = open_database(url)
    h100 = {"worker": {"gpus": ["NVIDIA H100 80GB HBM3"]}}
    a100 = {"worker": {"gpus": ["NVIDIA A100-SXM4-80GB"]}}
    assert hardware.hardware_of(h100, None) == "h100-sxm"
    assert hardware.hardware_of({"worker": {"gpus": ["X", "Y"]}}, None) == "X + Y"
    assert hardware.hardware_of({}, None) is None
    assert hardware.hardware_of(a100, "h100-sxm") == "h100-sxm"  # the annotation wins
    _annotate(url, annotated["a"], 20.0, device="h100-sxm")
    _annotate(url, annotated["b"], 20.0, device="a100-80gb")
    out = compare_svc.compare_runs(sessions, annotated["a"], [annotated["b"]])
    comp = out["comparability"]
    diff = {d["field"]: d["values"] for d in comp["differing"]}
    assert diff["hardware"] == ["h100-sxm", "a100-80gb"]
    # without annotations, the GPUs of the workers that ran them decide
    with session_scope(sessions) as s:
        for rid, stats in ((annotated["a"], h100), (annotated["b"], a100)):
            row = s.get(RunAnnotation, rid)
            assert row is not None
            s.delete(row)
            run = repo.find_run(s, rid)
            assert run is not None
            repo.update_run(s, rid, load_stats=(run.load_stats or {}) | stats)
    out = compare_svc.compare_runs(sessions, annotated["a"], [annotated["b"]])
    diff = {d["field"]: d["values"] for d in out["comparability"]["differing"]}
    assert diff == {"hardware": ["h100-sxm", "a100-80gb"]}
    assert out["comparability"]["variable"] == "hardware"
    same = check([{"hardware": "h100-sxm"}, {"hardware": "h100-sxm"}])
    assert same.differing == []


def test_cli_sweep_server_on_the_embedded_worker(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    sim: SimulatorThread,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from app.cli.main import main

    srv = live_server(sqlite_url, local_worker=True)  # `serve`'s own worker takes sweeps
    code = main(
        [
            "sweep", "--server", srv.url, "--token", srv.admin_token,
            "--base-url", sim.base_url, "--model", "tokentrace-sim", "--num-prompts", "6",
            "--input-len", "16", "--output-len", "4", "--concurrencies", "1", "2", "--json",
        ]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads(out)
    assert summary["status"] == "succeeded" and summary["job_id"]
    assert [s["load"] for s in summary["steps"]] == [1.0, 2.0]
    assert [s["load_kind"] for s in summary["steps"]] == ["concurrency"] * 2
