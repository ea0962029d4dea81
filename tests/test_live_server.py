"""The server as a real subprocess over real HTTP (the ``live_server`` fixture)."""

from __future__ import annotations

import httpx

from tests.api_support import SPEC
from tests.live_server import LiveServerFactory


def test_live_server_serves_survives_a_kill_and_restarts(
    live_server: LiveServerFactory, db_url: str
) -> None:
    srv = live_server(db_url)
    auth = {"Authorization": f"Bearer {srv.admin_token}"}
    health = httpx.get(srv.url + "/healthz").json()
    assert health["status"] == "ok" and health["database"] in ("sqlite", "postgresql")
    assert "/api/v1/runs" in httpx.get(srv.url + "/openapi.json").json()["paths"]
    r = httpx.post(srv.url + "/api/v1/runs", json=SPEC, headers=auth)
    assert r.status_code == 201, r.text
    run_id = r.json()["run_id"]
    assert httpx.post(srv.url + "/api/v1/runs", json=SPEC).status_code == 401
    bad = httpx.post(srv.url + "/api/v1/runs", json=SPEC | {"seed": "x"}, headers=auth)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "seed"]

    w = {"Authorization": f"Bearer {srv.worker_token}"}
    caps = {"hostname": "h", "tokentrace_version": "0.1.0"}
    wid = httpx.post(
        srv.url + "/api/v1/workers/register", json={"capabilities": caps}, headers=w
    ).json()["worker_id"]
    job = httpx.post(f"{srv.url}/api/v1/workers/{wid}/lease", json={}, headers=w).json()["job"]
    assert job["run_id"] == run_id

    srv.kill()
    assert not srv.running
    srv.restart()
    listed = httpx.get(srv.url + "/api/v1/runs").json()
    assert [i["id"] for i in listed["items"]] == [run_id]
    # the lease survived the restart (extended by one TTL): the worker carries on
    hb = httpx.post(
        f"{srv.url}/api/v1/jobs/{job['job_id']}/heartbeat",
        json={"lease_id": job["lease_id"]},
        headers=w,
    )
    assert hb.status_code == 200 and hb.json()["cancel"] is False
    srv.stop()
    assert not srv.running
