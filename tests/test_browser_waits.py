"""The queue-wait and send-lag charts of a closed-loop run in headless Chromium (issue 24
item 3): both drawn by Plotly as SVG, the send lag's initial burst as its own trace, their
points the export's numbers, and the header's send lag p99 the p99 of the counted points.
A run from before queue waits were recorded draws both charts' "no data" reason."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import delete, update

from app.domain import PHASES
from app.services.runs import open_database
from app.storage.db import session_scope
from app.storage.models import Request, RunPageSummary
from app.targets.sim_config import SimConfig
from tests.browser_support import CHROMIUM, Console, DashboardServer, assert_drawn, browser_missing
from tests.web_support import bench

pytestmark = pytest.mark.slow
_MISSING = browser_missing()
if _MISSING:
    pytest.skip(f"browser tests skipped: {_MISSING}", allow_module_level=True)

from playwright.sync_api import Page, sync_playwright  # noqa: E402

C = 3


@dataclass(frozen=True)
class Runs:
    server: DashboardServer
    closed: str  # concurrency 3, all due at once
    old: str  # the same run with its queue waits erased (as before phases were recorded)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    tmp = tmp_path_factory.mktemp("waits")
    url = f"sqlite:///{tmp / 'waits.db'}"
    sessions = open_database(url)
    spec: dict[str, Any] = {
        "num_prompts": 18,
        "max_concurrency": C,
        "request_rate": float("inf"),
        "input_len": 16,
        "output_len": 8,
    }
    closed = bench(sessions, SimConfig(ttft_ms=15, itl_ms=1, seed=7), "closed", **spec)
    old = bench(sessions, SimConfig(ttft_ms=15, itl_ms=1, seed=8), "old", **spec)
    with session_scope(sessions) as s:  # as a run stored before migration 0008: no phases
        phases = {f"{p}_ns": None for p in PHASES}
        s.execute(update(Request).where(Request.run_id == old).values(**phases, conn_id=None))
        s.execute(delete(RunPageSummary).where(RunPageSummary.run_id == old))
    srv = DashboardServer(url, tmp / "server.log", local_worker=False)
    try:
        yield Runs(srv, closed, old)
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def page(runs: Runs) -> Iterator[Page]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        ctx = b.new_context(viewport={"width": 1400, "height": 1000})
        yield ctx.new_page()
        ctx.close()
        b.close()


def _figure(page: Page, key: str) -> dict[str, Any]:
    fig: dict[str, Any] = page.evaluate(
        f"() => JSON.parse(document.getElementById('fig-{key}').textContent)"
    )
    return fig


def test_closed_loop_waits_drawn_as_the_export_says(page: Page, runs: Runs) -> None:
    con = Console(page)
    rows = httpx.get(f"{runs.server.url}/runs/{runs.closed}/requests.json").json()
    rows = sorted((r for r in rows if not r["warmup"]), key=lambda r: r["idx"])
    lag = np.array([r["send_lag_ms"] for r in rows])
    queued = np.array([r["queued_ms"] for r in rows])
    page.goto(f"{runs.server.url}/runs/{runs.closed}")
    found = {c["id"]: c for c in assert_drawn(page)}
    send, queue = found["plot-send_lag"], found["plot-queue_wait"]
    assert send["expected"] == 2 and send["drawn"] >= 2  # requests + the initial burst
    assert queue["expected"] == 1 and queue["drawn"] >= 1
    assert "initial burst" in send["text"] and "queue wait (ms)" in queue["text"]
    # the points drawn are the export's (the first C requests are the burst: fresh slots)
    traces = {t["name"]: t for t in _figure(page, "send_lag")["data"]}
    assert sorted(traces["requests"]["y"]) == pytest.approx(sorted(lag[C:]), abs=1e-3)
    assert len(traces["initial burst (not in the p99)"]["y"]) == C
    assert sorted(_figure(page, "queue_wait")["data"][0]["y"]) == pytest.approx(
        sorted(queued), abs=1e-3
    )
    header = page.inner_text("#client-health")
    assert f"send lag p99 {np.percentile(lag[C:], 99):.2f} ms" in header
    assert con.problems() == []


def test_a_run_without_queue_waits_says_no_data(page: Page, runs: Runs) -> None:
    con = Console(page)
    page.goto(f"{runs.server.url}/runs/{runs.old}")
    found = {c["id"]: c for c in assert_drawn(page)}
    for key in ("plot-send_lag", "plot-queue_wait"):
        assert found[key]["expected"] == 0
        assert "no data: no queue wait recorded" in found[key]["text"], found[key]
    assert con.problems() == []
