"""No data lost: PostgreSQL connections killed mid-upload (the batch is retried and lands
once), and the run page of a partial run says what is missing.

The worker SIGKILL and server restart cases are in tests/test_worker_faults.py."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app.services import jobs as job_svc
from app.targets.sim_config import SimConfig
from app.targets.simulator import SimulatorThread, start_simulator_thread
from tests.api_support import Api, api_client, wire
from tests.live_server import LiveServerFactory, live_server  # noqa: F401
from tests.test_api_jobs import _expire
from tests.worker_helpers import api, request_indices, sim_spec, start_worker_process, wait_job


@pytest.fixture
def sqlite_api(sqlite_url: str) -> Iterator[Api]:
    with api_client(sqlite_url) as a:
        yield a


def test_partial_run_page_says_what_is_missing(sqlite_api: Api) -> None:
    a = sqlite_api
    out = a.create_run(name="half done")  # 6 planned requests
    job = a.lease(a.register())
    assert job is not None
    body = {"lease_id": job["lease_id"], "batch_no": 0, "requests": wire([0, 1, 2, 3])}
    assert a.post_job(out["job_id"], "results", body).status_code == 200
    expired = _expire(a, out["job_id"])
    assert [e.outcome for e in expired] == ["partial"]
    detail = a.client.get(f"/api/v1/runs/{out['run_id']}").json()
    assert detail["run"]["status"] == "partial"
    page = a.client.get(f"/runs/{out['run_id']}").text
    assert "partial" in page
    assert "4 of 6 planned requests were stored" in page  # says what is missing
    assert "worker lost" in page
    assert job_svc.expire_lost_leases(a.sessions) == []  # nothing more happens to it


# ---------------------------------------------------------------- PostgreSQL connection


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorThread]:
    s = start_simulator_thread(SimConfig(ttft_ms=5, itl_ms=2, output_len=16, seed=8))
    yield s
    s.stop()


class BackendKiller:
    """Terminates the server's PostgreSQL backends (found by application_name) every
    ``every_s`` from a separate admin connection, until stopped."""

    def __init__(self, admin_url: str, app_name: str, every_s: float) -> None:
        self.engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        self.app_name = app_name
        self.every_s = every_s
        self.killed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        with self.engine.connect() as conn:
            while not self._stop.wait(self.every_s):
                n = conn.execute(
                    text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE application_name = :n AND pid <> pg_backend_pid()"
                    ),
                    {"n": self.app_name},
                ).scalar()
                self.killed += int(n or 0)

    def __enter__(self) -> BackendKiller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.engine.dispose()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_pg_connections_killed_mid_upload_every_batch_lands_once(
    live_server: LiveServerFactory,  # noqa: F811
    pg_url: str,
    sim: SimulatorThread,
    tmp_path: Path,
) -> None:
    app_name = f"tt-rel-{secrets.token_hex(4)}"
    url = make_url(pg_url).update_query_dict({"application_name": app_name})
    srv = live_server(url.render_as_string(hide_password=False))
    n = 240
    with api(srv) as c:
        spec = sim_spec(
            sim.base_url, num_prompts=n, request_rate=60, arrival="constant", output_len=16
        )
        r = c.post("/runs", json=spec)
        assert r.status_code == 201, r.text
        run_id, job_id = r.json()["run_id"], r.json()["job_id"]
        w = start_worker_process(srv.url, srv.worker_token, tmp_path / "w1")
        try:
            with BackendKiller(pg_url, app_name, every_s=0.25) as killer:
                j = wait_job(c, job_id, ("succeeded", "failed", "cancelled"), 90)
        finally:
            if w.poll() is None:
                w.kill()
                w.wait(10)
        indices = request_indices(c, run_id)
    log = srv.log_tail(200_000)
    assert killer.killed >= 5, "the test must actually kill connections during the run"
    assert j["state"] == "succeeded" and j["attempt"] == 1, (j, log[-3000:])
    assert sorted(indices) == list(range(n))  # every request once: none lost, none doubled
    print(f"killed {killer.killed} backends; 503s logged: {log.count('database unavailable')}")


def test_lost_db_connection_is_503_so_clients_retry(sqlite_api: Api) -> None:
    """The handler the PostgreSQL test relies on, deterministically: a dropped connection
    during a request answers 503 (retryable), not 500."""
    from sqlalchemy.exc import OperationalError

    from app.api import routes_runs

    def boom(*_a: object, **_k: object) -> None:
        raise OperationalError("SELECT 1", {}, Exception("server closed the connection"))

    mp = pytest.MonkeyPatch()
    mp.setattr(routes_runs.bench_jobs, "create_bench_run", boom)
    try:
        r = sqlite_api.client.post(
            "/api/v1/runs",
            json={"base_url": "http://127.0.0.1:9", "model": "m"},
            headers=sqlite_api.h(sqlite_api.run),
        )
    finally:
        mp.undo()
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert "retry" in r.json()["detail"]
