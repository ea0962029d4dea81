"""A worker measures its clock offset to the server on its heartbeats (issue 26 part 2):
each heartbeat's reply carries the server's receipt and send times, the worker keeps the
exchange with the smallest round trip, and the run stores the offset and its bound
(``load_stats.clock_sync``). Worker and server share this host's clock here: the true
offset is 0, so it must lie within the stored bound."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from app.protocol.wire import HeartbeatResponse
from app.targets.simulator import SimulatorThread
from tests.api_support import api_client
from tests.live_server import LiveServer, live_server  # noqa: F401
from tests.test_worker import make_worker, server, sim  # noqa: F401
from tests.worker_helpers import api, sim_spec, submit, wait_job

pytestmark = pytest.mark.timeout(60)


def test_the_run_stores_the_offset_within_its_bound(
    server: LiveServer,  # noqa: F811
    sim: SimulatorThread,  # noqa: F811
    tmp_path: Path,
) -> None:
    # ~1 s of load: a few heartbeats at the test's 0.2 s interval
    spec = sim_spec(sim.base_url, num_prompts=30, request_rate=30, arrival="constant")
    with api(server) as c:
        run_id, job_id = submit(c, spec)
        outcome = asyncio.run(make_worker(server, tmp_path).run_once())
        assert outcome is not None and outcome.status == "succeeded", outcome
        wait_job(c, job_id, ("succeeded",), 10)
        detail = c.get(f"/runs/{run_id}").json()
    sync = detail["report"]["load"]["clock_sync"]
    assert sync["samples"] >= 1 and sync["rtt_ns"] >= 0
    assert abs(sync["offset_ns"]) <= sync["bound_ns"]  # the true offset (0) within the bound
    assert sync["bound_ns"] == (sync["rtt_ns"] + 1) // 2
    assert sync["flagged"] is (sync["bound_ns"] > 5_000_000)


def test_the_heartbeat_reply_carries_the_server_times(sqlite_url: str) -> None:
    with api_client(sqlite_url) as a:
        job_id = a.create_run()["job_id"]
        job = a.lease(a.register())
        assert job is not None
        t1 = time.time_ns()
        hb = a.post_job(job_id, "heartbeat", {"lease_id": job["lease_id"]})
        t4 = time.time_ns()
    assert hb.status_code == 200, hb.text
    r = HeartbeatResponse.model_validate(hb.json())
    assert r.clock_t2_ns is not None and r.clock_t3_ns is not None
    assert t1 <= r.clock_t2_ns <= r.clock_t3_ns <= t4  # one clock: the exchange's order
