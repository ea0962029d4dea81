"""Issue 24 items 4 and 9 in headless Chromium: the live run page of a queued run, then of a
running one whose requests are stored, then its end (a cancel); and one pass over the run
pages and the runs list of every verdict situation (``tests/states_support.py``).

The live page's figures are checked against what the test itself uploaded through the
worker protocol (12 requests of 40 planned) and the server's stored start time."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.services.runs import open_database
from tests.api_support import CAPS, SPEC, wire
from tests.browser_support import CHROMIUM, Console, browser_missing, wait_js
from tests.live_server import LiveServer, LiveServerFactory, live_server  # noqa: F401
from tests.states_support import SITUATIONS, seed_situations

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
_MISSING = browser_missing()
if _MISSING:
    pytest.skip(f"browser tests skipped: {_MISSING}", allow_module_level=True)

from playwright.sync_api import Browser, Page, sync_playwright  # noqa: E402

PLANNED = 40
STORED = 12


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    yield pg
    ctx.close()


def _client(srv: LiveServer, token: str) -> httpx.Client:
    return httpx.Client(base_url=srv.url + "/api/v1", timeout=30, trust_env=False,
                        headers={"Authorization": f"Bearer {token}"})  # fmt: skip


def _text(page: Page, selector: str) -> str:
    return str(page.locator(selector).inner_text()).strip()


def _header(page: Page) -> dict[str, Any]:
    out: dict[str, Any] = page.evaluate(
        """() => ({
          heading: document.getElementById('live-heading').textContent.trim(),
          label: document.querySelector('#live-progress .label').textContent.trim(),
          width: document.querySelector('#live-progress .bar').style.width,
          status: document.querySelector('#card-status .value').textContent.trim(),
          requests: (document.getElementById('run-requests') || {}).textContent,
          stored: document.getElementById('live-stored').textContent,
          started: (document.querySelector('#run-started time') || {dataset: {}})
            .getAttribute ? document.querySelector('#run-started time').getAttribute('datetime')
            : null,
        })"""
    )
    return out


def test_live_page_from_queued_to_running_to_cancelled(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    page: Page,
) -> None:
    srv = live_server(sqlite_url)
    admin, worker = _client(srv, srv.admin_token), _client(srv, srv.worker_token)
    with admin, worker:
        r = admin.post("/runs", json=SPEC | {"num_prompts": PLANNED, "name": "live"})
        assert r.status_code == 201, r.text
        run_id, job_id = r.json()["run_id"], r.json()["job_id"]

        # queued: headed "Queued", nothing started, no data, no empty charts
        con = Console(page)
        page.goto(f"{srv.url}/runs/{run_id}")
        assert _text(page, "#live-heading") == "Queued"
        assert _text(page, "#live-progress .label") == "queued"
        assert _text(page, "#run-started") == "not yet"
        assert _text(page, "#card-validity .value") == "pending"
        assert _text(page, "#card-throughput .detail") == "no data yet"
        assert page.locator("[data-figure]").count() == 0  # not ~3,000 px of empty charts
        assert page.locator("#no-charts").is_visible()
        assert page.evaluate("document.documentElement.scrollHeight") < 2600

        # a worker takes it, says it is running (its own count ahead of the stored one:
        # 20 done on the worker, 12 uploaded) and uploads 12 requests
        reg = worker.post("/workers/register", json={"name": "w", "capabilities": CAPS})
        wid = reg.json()["worker_id"]
        job = worker.post(f"/workers/{wid}/lease", json={}).json()["job"]
        lid = job["lease_id"]
        progress = {"phase": "measure", "planned": PLANNED, "sent": 24, "done": 20}
        hb = worker.post(f"/jobs/{job_id}/heartbeat", json={"lease_id": lid, "progress": progress})
        assert hb.status_code == 200, hb.text
        up = worker.post(f"/jobs/{job_id}/results", json={
            "lease_id": lid, "batch_no": 0, "requests": wire(list(range(STORED)))})  # fmt: skip
        assert up.status_code == 200, up.text
        started = admin.get(f"/runs/{run_id}").json()["run"]["started_at"]
        assert started is not None

        # the open page follows the server's stored state: one snapshot for all of it
        wait_js(page, "() => document.getElementById('live-heading').textContent === 'Running'")
        wait_js(page, f"() => document.getElementById('run-requests').textContent === '{STORED}'")
        h = _header(page)
        want_pct = 100.0 * STORED / PLANNED  # 30%
        assert h["label"] == f"running: {STORED} of {PLANNED} requests stored"
        assert float(h["width"].rstrip("%")) == pytest.approx(want_pct, abs=0.05)
        assert h["stored"] == str(STORED)
        assert h["status"] == "running"
        assert h["started"] is not None and h["started"].startswith(started[:19])

        # a reload draws the same from the server: and now the charts, with data
        page.reload()
        h = _header(page)
        assert h["heading"] == "Running" and h["requests"] == str(STORED)
        assert h["label"] == f"running: {STORED} of {PLANNED} requests stored"
        assert page.locator("#no-charts").count() == 0 and page.locator("[data-figure]").count()

        # the user cancels; the worker stops and completes: the page reloads by itself
        assert admin.post(f"/runs/{run_id}/cancel").status_code == 200
        done = {"lease_id": lid, "status": "cancelled", "total_batches": 1, "records": STORED}
        assert worker.post(f"/jobs/{job_id}/complete", json=done).status_code == 200
        wait_js(page, "() => !document.getElementById('live-heading')", 20_000)
        assert _text(page, "#card-status .value") == "cancelled"
        assert _text(page, "#card-validity .value") == "cancelled"
        assert page.locator("#trust-warnings").count() == 0
        note = _text(page, "#run-notices")
        assert f"{STORED} of {PLANNED} planned requests completed" in note
        assert con.problems() == [], con.problems()


def test_every_verdict_drawn_the_same_in_the_list_and_on_its_page(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    page: Page,
    tmp_path: Path,
) -> None:
    ids = seed_situations(open_database(sqlite_url), tmp_path)
    srv = live_server(sqlite_url)
    con = Console(page)
    page.goto(srv.url + "/")
    cells = page.evaluate(
        """() => Object.fromEntries(
             Array.from(document.querySelectorAll('#runs-table tr[data-run-id]')).map((tr) =>
               [tr.dataset.runId, tr.querySelector('.validity').textContent.trim()]))"""
    )
    for sit in SITUATIONS:
        rid = ids[sit.key]
        assert cells[rid] == sit.word, sit.key
        page.goto(f"{srv.url}/runs/{rid}")
        card = page.locator("#card-validity")
        assert _text(page, "#card-validity .value") == sit.word, sit.key
        tone = re.sub(r"\bcard\b", "", str(card.get_attribute("class"))).strip()
        bad = page.locator("#trust-warnings").is_visible() if page.locator(
            "#trust-warnings").count() else False  # fmt: skip
        notice = page.locator("#run-notices").count() > 0
        assert (bad, notice) == (sit.banner == "bad", sit.banner == "warn"), sit.key
        assert (tone == "bad") == bad, (sit.key, tone)
        if sit.word == "valid":
            assert tone == "good" and page.locator(".banner").count() == 0
    assert con.problems() == [], con.problems()
