"""Live panels of a running run: the latency percentiles by window (against numpy), the
target's /metrics carried by a worker's heartbeats (bounded, checked on the way in) and
kept as a history (counters as rates), and in headless Chromium the panels drawing and
updating in place while a real run streams, with a clean console."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from app.analysis.live_windows import windowed_percentiles
from app.client.spec import RunSpec
from app.domain import RequestRecord, RequestStatus
from app.services import live_series
from app.services.runs import store_requests
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.targets.sim_config import SimConfig
from app.targets.simulator import SimulatorThread, start_simulator_thread
from tests.api_support import Api, api_client
from tests.browser_support import CHROMIUM, Console, DashboardServer, browser_missing, wait_js
from tests.live_server import make_token
from tests.worker_fakes import FakeServer


def test_windows_by_hand() -> None:
    # ends at 0.2, 0.7, 1.5 s (1 s windows: [0,1) and [1,2)); a failed one and a NaN skipped
    got = windowed_percentiles(
        [0.2, 0.7, 1.5, 1.6, 0.3], [10.0, 30.0, 50.0, 999.0, float("nan")],
        [True, True, True, False, True],
    )  # fmt: skip
    assert got["t_s"] == [1.0, 2.0] and got["width_s"] == 1.0
    assert got["p50"] == [20.0, 50.0]  # (10+30)/2; one value
    assert got["p90"] == pytest.approx([28.0, 50.0])  # 10 + 0.9*20
    assert windowed_percentiles([], [], [])["t_s"] == []
    wide = windowed_percentiles([0.5, 299.5], [1.0, 2.0], [True, True])
    assert wide["width_s"] == 5.0 and len(wide["t_s"]) == 60  # at most 60 windows


def _record(i: int, sent_ms: float, ttft_ms: float, end_ms: float) -> RequestRecord:
    sent, end = int(sent_ms * 1e6), int(end_ms * 1e6)
    t = np.array([sent + int(ttft_ms * 1e6), end - 1000], np.int64)
    return RequestRecord(
        index=i, scheduled_ns=sent, sent_ns=sent, end_ns=end, done_ns=end,
        status=RequestStatus.OK, http_status=200, input_tokens=8, output_tokens=2,
        usage_completion_tokens=2, token_source="usage", event_t_ns=t,
        event_bytes=np.array([10, 10], np.int32), event_kind=np.zeros(2, np.int8),
        event_tokens=np.ones(2, np.int32),
    )  # fmt: skip


def test_live_json_series(sqlite_url: str) -> None:
    with api_client(sqlite_url) as api:
        run_id = _running_run(api)
        rng = np.random.default_rng(1)
        ttft = np.round(rng.uniform(5, 50, 40), 3)
        sent = np.arange(40) * 100.0  # one every 100 ms: 4 s
        end = sent + ttft + 20.0
        with session_scope(api.sessions) as s:
            store_requests(s, run_id, [_record(i, sent[i], ttft[i], end[i]) for i in range(40)])
            job = job_repo.job_for_run(s, run_id)
            assert job is not None
            for t, running, gen in ((1.0, 3, 0.0), (2.0, 5, 10.0), (3.0, 4, 30.0), (3.0, 9, 99.0)):
                live_series.record(s, job.id, {"server_metrics": {"running": running,
                                   "generation_tokens": gen}, "server_metrics_t_s": t})  # fmt: skip
        body = api.client.get(f"/runs/{run_id}/live.json", params={"series": "1"}).json()
        lat = body["latency"]["ttft"]
        assert lat["width_s"] == 1.0
        for k, t_end in enumerate(lat["t_s"]):
            inside = ttft[(end / 1000 >= t_end - 1) & (end / 1000 < t_end)]
            want = np.percentile(inside, [50, 90, 99]) if inside.size else [None] * 3
            got = [lat["p50"][k], lat["p90"][k], lat["p99"][k]]
            assert got == pytest.approx(list(want), abs=1e-6), k
        server = body["server"]
        assert server["t_s"] == [1.0, 2.0, 3.0]  # the repeated scrape kept once
        assert server["gauges"]["running"] == [3, 5, 4]
        assert server["rates"]["generation_tokens_per_s"] == [None, 10.0, 20.0]
        panels = body["panels"]
        assert set(panels) == {"latency_ttft", "latency_tpot", "latency_e2e", "server_queue",
                               "server_kv", "server_tokens"}  # fmt: skip
        assert [t["name"] for t in panels["latency_ttft"]["data"]] == ["p50", "p90", "p99"]
        assert panels["server_kv"]["data"] == []  # not exposed: "no data", not zeros
        plain = api.client.get(f"/runs/{run_id}/live.json").json()
        assert "panels" not in plain and plain["stored"] == 40


def _running_run(api: Api) -> str:
    out = api.create_run()
    with session_scope(api.sessions) as s:
        repo.start_run(s, out["run_id"])
    return str(out["run_id"])


def test_history_is_bounded_and_restarts_per_step(sqlite_url: str) -> None:
    with api_client(sqlite_url) as api:
        run_id = _running_run(api)
        with session_scope(api.sessions) as s:
            job = job_repo.job_for_run(s, run_id)
            assert job is not None
            for i in range(live_series.MAX_POINTS + 50):
                live_series.record(s, job.id, {"server_metrics": {"waiting": i},
                                               "server_metrics_t_s": float(i)})  # fmt: skip
            got = live_series.series(s, job.id)
            assert len(got["t_s"]) <= live_series.MAX_POINTS
            assert got["t_s"][-1] == live_series.MAX_POINTS + 49  # the newest kept
            assert got["gauges"]["waiting"] == got["t_s"]
            live_series.record(s, job.id, {"server_metrics": {"waiting": 1}, "run_id": "step2",
                                           "server_metrics_t_s": 0.5})  # fmt: skip
            assert live_series.series(s, job.id)["t_s"] == [0.5]


def test_heartbeat_server_metrics_are_checked(sqlite_url: str) -> None:
    with api_client(sqlite_url) as api:
        api.create_run()
        wid = api.register()
        job = api.lease(wid)
        assert job is not None
        lid = job["lease_id"]
        bad = [
            {"server_metrics": {f"k{i}": 1.0 for i in range(17)}, "server_metrics_t_s": 1.0},
            {"server_metrics": {"running": "NaN"}, "server_metrics_t_s": 1.0},
            {"server_metrics": {"x" * 65: 1.0}, "server_metrics_t_s": 1.0},
            {"server_metrics": {"running": 1.0}, "server_metrics_t_s": "inf"},
        ]
        for progress in bad:
            r = api.post_job(job["job_id"], "heartbeat", {"lease_id": lid, "progress": progress})
            assert r.status_code == 422, (progress, r.text)
        good = {"server_metrics": {"running": 2.0, "kv_cache_usage": 0.25},
                "server_metrics_t_s": 1.5}  # fmt: skip
        r = api.post_job(job["job_id"], "heartbeat", {"lease_id": lid, "progress": good})
        assert r.status_code == 200, r.text
        with session_scope(api.sessions) as s:
            got = live_series.series(s, job["job_id"])
        assert got["t_s"] == [1.5] and got["gauges"]["kv_cache_usage"] == [0.25]


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorThread]:
    s = start_simulator_thread(SimConfig(ttft_ms=20, itl_ms=10, output_len=8, seed=1))
    yield s
    s.stop()


def test_worker_heartbeats_carry_the_targets_metrics(sim: SimulatorThread, tmp_path: Path) -> None:
    from app.worker.loop import Worker, WorkerOptions

    fake = FakeServer()
    spec = RunSpec(base_url=sim.base_url, model="tokentrace-sim", input_len=8, output_len=8,
                   num_prompts=30, request_rate=20.0)  # 1.5 s  # fmt: skip
    fake.add_job(spec.model_dump(mode="json"))
    opts = WorkerOptions(heartbeat_interval_s=0.1, poll_interval_s=0.05, batch_interval_s=0.1)
    w = Worker("http://fake", fake.token, state_dir=tmp_path / "w", options=opts,
               transport=fake.transport)  # fmt: skip
    outcome = asyncio.run(w.run_once())
    assert outcome is not None and outcome.status == "succeeded"
    (job,) = fake.jobs.values()
    carried = [p for p in job.progress if p.server_metrics]
    assert carried, "no heartbeat carried the target's /metrics"
    times = [p.server_metrics_t_s for p in carried]
    assert all(t is not None and math.isfinite(t) and t >= 0 for t in times)
    assert times == sorted(times)
    assert {"running", "waiting", "generation_tokens"} <= set(carried[-1].server_metrics or {})


_MISSING = browser_missing()


@pytest.mark.slow
@pytest.mark.skipif(_MISSING is not None, reason=f"browser tests skipped: {_MISSING}")
def test_live_panels_update_in_place_in_chromium(
    sim: SimulatorThread, sqlite_url: str, tmp_path: Path
) -> None:
    from playwright.sync_api import sync_playwright

    srv = DashboardServer(sqlite_url, tmp_path / "s.log", local_worker=True)
    token = make_token(sqlite_url, "run")
    try:
        # ~30 s: still live when the test ends, however slowly the browser starts
        body = {"base_url": sim.base_url, "model": "tokentrace-sim", "input_len": 8,
                "output_len": 8, "num_prompts": 150, "request_rate": 5.0}  # fmt: skip
        r = httpx.post(f"{srv.url}/api/v1/runs", json=body,
                       headers={"Authorization": f"Bearer {token}"})  # fmt: skip
        assert r.status_code == 201, r.text
        run_id = r.json()["run_id"]
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_context(viewport={"width": 1400, "height": 1200}).new_page()
                con = Console(page)
                page.goto(f"{srv.url}/runs/{run_id}")
                panel = "#live-panels [data-live-panel"
                wait_js(
                    page,
                    f"""() => {{
                  const d = document.querySelector('{panel}="latency_ttft"]');
                  return d && Number(d.dataset.points || 0) > 0; }}""",
                )
                wait_js(
                    page,
                    f"""() => {{
                  const d = document.querySelector('{panel}="server_queue"]');
                  return d && Number(d.dataset.points || 0) > 0; }}""",
                )
                first: Any = page.evaluate(f"""() => {{
                  const d = document.querySelector('{panel}="latency_ttft"]');
                  d.__same = 1;  // an element redrawn in place keeps it
                  return [Number(document.getElementById('live-panels').dataset.polls),
                          d.querySelectorAll('.main-svg g.trace').length];
                }}""")
                assert first[1] >= 1
                wait_js(page, f"() => Number(document.getElementById('live-panels')"
                              f".dataset.polls) >= {first[0] + 2}")  # fmt: skip
                same = page.evaluate(f"""() => document.querySelector(
                  '{panel}="latency_ttft"]').__same === 1""")
                assert same, "the panel was rebuilt, not updated in place"
                assert con.problems() == [], con.problems()
            finally:
                browser.close()
    finally:
        srv.stop()
