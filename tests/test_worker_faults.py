"""Worker fault tolerance with real processes: a worker SIGKILLed mid-run, a server restarted
mid-run, and four workers racing for 50 jobs on PostgreSQL."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.targets.sim_config import SimConfig
from app.targets.simulator import SimulatorThread, start_simulator_thread
from tests.live_server import LiveServerFactory, live_server  # noqa: F401
from tests.worker_helpers import (
    api,
    job,
    request_indices,
    sim_spec,
    start_worker_process,
    submit,
    wait_for,
    wait_job,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

TTL = {"TOKENTRACE_LEASE_TTL_S": "2"}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorThread]:
    s = start_simulator_thread(SimConfig(ttft_ms=5, itl_ms=1, output_len=8, seed=5))
    yield s
    s.stop()


def _kill(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.kill()
        p.wait(10)


def test_sigkill_after_uploads_keeps_each_request_once(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    sim: SimulatorThread,
    tmp_path: Path,
) -> None:
    srv = live_server(sqlite_url, env=TTL)
    with api(srv) as c:
        spec = sim_spec(sim.base_url, num_prompts=200, request_rate=25, arrival="constant")
        run_id, job_id = submit(c, spec)
        w = start_worker_process(srv.url, srv.worker_token, tmp_path / "w1")
        try:
            wait_for(lambda: len(request_indices(c, run_id)) >= 10, 20, "first uploads")
        finally:
            _kill(w)
        stored = request_indices(c, run_id)
        j = wait_job(c, job_id, ("failed", "succeeded", "cancelled"), 15)
        after = request_indices(c, run_id)
        run = c.get(f"/runs/{run_id}").json()["run"]
    assert j["state"] == "failed" and run["status"] == "partial"
    assert len(after) == len(set(after)) >= len(stored) > 0
    assert len(after) < 200


def test_sigkill_before_uploads_requeues_then_runs_once(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    tmp_path: Path,
) -> None:
    srv = live_server(sqlite_url, env=TTL)
    slow = start_simulator_thread(SimConfig(ttft_ms=2500, itl_ms=1, output_len=4, seed=6))
    try:
        with api(srv) as c:
            run_id, job_id = submit(c, sim_spec(slow.base_url, num_prompts=4, output_len=4))
            w = start_worker_process(srv.url, srv.worker_token, tmp_path / "w1")
            try:
                wait_job(c, job_id, ("leased", "running"), 20)
            finally:
                _kill(w)
            assert request_indices(c, run_id) == []
            wait_for(lambda: job(c, job_id)["state"] == "queued", 15, "requeue")
            w2 = start_worker_process(srv.url, srv.worker_token, tmp_path / "w2")
            try:
                j = wait_job(c, job_id, ("succeeded", "failed"), 30)
            finally:
                _kill(w2)
            indices = request_indices(c, run_id)
    finally:
        slow.stop()
    assert j["state"] == "succeeded" and j["attempt"] == 2
    assert sorted(indices) == [0, 1, 2, 3]


def test_server_restart_mid_run_loses_and_duplicates_nothing(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    sim: SimulatorThread,
    tmp_path: Path,
) -> None:
    srv = live_server(sqlite_url, env={"TOKENTRACE_LEASE_TTL_S": "10"})
    with api(srv) as c:
        spec = sim_spec(sim.base_url, num_prompts=80, request_rate=20, arrival="constant")
        run_id, job_id = submit(c, spec)
        w = start_worker_process(srv.url, srv.worker_token, tmp_path / "w1")
        try:
            wait_for(lambda: len(request_indices(c, run_id)) >= 5, 20, "first uploads")
            srv.kill()  # no shutdown code: the worker's uploads are refused for a while
            srv.restart()
            j = wait_job(c, job_id, ("succeeded", "failed", "cancelled"), 40)
        finally:
            _kill(w)
        indices = request_indices(c, run_id)
    assert j["state"] == "succeeded" and j["attempt"] == 1
    assert sorted(indices) == list(range(80))


@pytest.mark.postgres
def test_four_workers_fifty_jobs_each_runs_once(
    live_server: LiveServerFactory,  # noqa: F811
    pg_url: str,
    sim: SimulatorThread,
    tmp_path: Path,
) -> None:
    srv = live_server(pg_url)
    with api(srv) as c:
        runs = [
            submit(c, sim_spec(sim.base_url, num_prompts=2, output_len=4, max_concurrency=2))
            for _ in range(50)
        ]
        workers = [
            start_worker_process(srv.url, srv.worker_token, tmp_path / f"w{i}") for i in range(4)
        ]
        try:

            def all_done() -> bool:
                page = c.get("/jobs", params={"state": "succeeded", "limit": 500}).json()
                return bool(page["total"] >= 50)

            wait_for(all_done, 60, "50 jobs succeeded", poll_s=0.5)
        finally:
            for w in workers:
                _kill(w)
        jobs = {j["id"]: j for j in c.get("/jobs", params={"limit": 500}).json()["items"]}
        for run_id, job_id in runs:
            assert jobs[job_id]["state"] == "succeeded" and jobs[job_id]["attempt"] == 1
            assert sorted(request_indices(c, run_id)) == [0, 1]
        per_worker = {j["worker_id"] for j in jobs.values()}
    assert len(jobs) == 50
    assert len(per_worker) >= 2  # the work was actually shared
