"""The dashboard in headless Chromium (Debian's /usr/bin/chromium driven by Playwright):
pages load without console errors, plots carry data, the SLO edit changes goodput, and the
launch form queues a run that the embedded worker executes against the simulator."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from app.domain import RequestStatus
from app.services import auth
from app.storage import repository as repo
from app.storage.db import session_scope
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from tests.browser_support import (
    CHROMIUM,
    DashboardServer,
    browser_missing,
    submit_refused,
    wait_js,
)
from tests.web_support import Seeded, seed

pytestmark = pytest.mark.slow
_MISSING = browser_missing()
if _MISSING:
    pytest.skip(f"browser tests skipped: {_MISSING}", allow_module_level=True)

from playwright.sync_api import Browser, Page, sync_playwright  # noqa: E402
from playwright.sync_api import Error as PlaywrightError  # noqa: E402


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Seeded:
    return seed(tmp_path_factory.mktemp("browser"))


@pytest.fixture(scope="module")
def server(seeded: Seeded, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardServer]:
    log = tmp_path_factory.mktemp("logs") / "server.log"
    srv = DashboardServer(seeded.url, log, local_worker=True)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser(server: DashboardServer) -> Iterator[Browser]:
    # after the seeding: Playwright's sync API keeps an event loop running on this thread,
    # and the benchmarks that seed the database use asyncio.run
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


class Console:
    def __init__(self, page: Page) -> None:
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))

    def _console(self, msg: Any) -> None:
        if msg.type == "error":
            self.errors.append(msg.text)


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    yield pg
    ctx.close()


def _plot_points(page: Page, div_id: str) -> int:
    js = """(id) => { const d = document.getElementById(id);
      if (!d || !d.data) return -1;
      return d.data.reduce((n, t) => n + ((t.x || []).length), 0); }"""
    return int(page.evaluate(js, div_id))


def test_every_page_loads_without_console_errors(
    page: Page, server: DashboardServer, seeded: Seeded
) -> None:
    con = Console(page)
    urls = [
        "/",
        "/workers",
        "/sweeps",
        "/launch",
        "/signin",
        f"/compare?ids={seeded.normal}&ids={seeded.one}",
        f"/runs/{seeded.normal}/requests",
        f"/runs/{seeded.normal}/requests/1",
    ]
    for run_id in (seeded.normal, seeded.all_errors, seeded.one, seeded.imported):
        urls += [f"/runs/{run_id}", f"/runs/{run_id}?profile=vllm"]
    for url in urls:
        resp = page.goto(server.url + url)
        assert resp is not None and resp.status == 200, url
        page.wait_for_load_state("load")
        assert con.errors == [], f"{url}: {con.errors}"


def test_run_page_plots_have_data(page: Page, server: DashboardServer, seeded: Seeded) -> None:
    con = Console(page)
    page.goto(f"{server.url}/runs/{seeded.normal}")
    wait_js(page, "() => document.body.dataset.plotsDrawn === '1'")  # every visible one
    for div in (
        "plot-cdf_ttft",
        "plot-hist_ttft",
        "plot-timeline",
        "plot-throughput",
        "plot-send_lag",
        "plot-itl_position",
        "plot-ttft_input",
    ):
        assert _plot_points(page, div) > 0, div
    assert _plot_points(page, "plot-cdf_itl") == -1  # hidden tab: not drawn yet
    page.click("#dist-tabs button[data-dist='itl']")
    wait_js(page, "() => document.body.dataset.plotsDrawn === '1'")
    assert _plot_points(page, "plot-cdf_itl") > 0
    assert page.locator("#plot-timeline .main-svg").count() > 0  # plotly drew an SVG
    with session_scope(seeded.sessions) as s:
        recs = repo.load_records(s, seeded.normal)
    ok_idx = next(r.index for r in recs if r.status is RequestStatus.OK)
    req = page.goto(f"{server.url}/runs/{seeded.normal}/requests/{ok_idx}")
    assert req is not None and req.status == 200
    assert _plot_points(page, "plot-events") > 0
    assert con.errors == []


def _goodput(page: Page) -> str:
    return page.locator("#card-goodput .value").inner_text().strip()


def test_slo_edit_changes_goodput(page: Page, server: DashboardServer, seeded: Seeded) -> None:
    page.goto(f"{server.url}/runs/{seeded.normal}")
    before = _goodput(page)
    page.fill("#slo_ttft", "0.001")
    with page.expect_navigation():
        page.click("#slo-form button[type=submit]")
    assert _goodput(page) == "0.00 req/s"
    assert "slo_ttft=0.001" in page.url
    page.fill("#slo_ttft", "100000")
    with page.expect_navigation():
        page.click("#slo-form button[type=submit]")
    assert _goodput(page) not in ("0.00 req/s", "—")
    assert before != "0.00 req/s"


def test_launch_form_submits_and_the_run_appears(
    page: Page, server: DashboardServer, seeded: Seeded
) -> None:
    con = Console(page)
    with session_scope(seeded.sessions) as s:
        _, secret = auth.create_token(s, scopes=["run"], name="browser")
    page.goto(f"{server.url}/launch")
    assert page.locator("#signin-needed").count() == 1
    page.goto(f"{server.url}/signin?next=/launch")
    page.fill("#token", secret)
    with page.expect_navigation():
        page.click("#signin-form button[type=submit]")
    assert page.url.endswith("/launch") and page.locator("#signin-needed").count() == 0

    page.fill("#f-num_prompts", "0")  # a validation message beside the field first
    submit_refused(page, con, "#launch-submit")
    assert "greater than or equal to 1" in page.locator("#err-num_prompts").inner_text()

    sim = start_simulator_thread(SimConfig(ttft_ms=5, itl_ms=1, seed=9))
    try:
        page.fill("#f-base_url", sim.base_url)
        page.fill("#f-name", "launched from the browser")
        page.fill("#f-num_prompts", "20")
        page.fill("#f-request_rate", "100")
        page.fill("#f-output_len", "16")
        page.fill("#f-input_len", "32")
        with page.expect_navigation():
            page.click("#launch-submit")
        m = re.search(r"/runs/([0-9a-f]+)$", page.url)
        assert m, page.url
        run_id = m.group(1)
        # the embedded worker runs it; the page follows the job and reloads when it ends
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if page.locator("#live").count() == 0 and "succeeded" in page.inner_text(".cards"):
                break
            time.sleep(0.5)
        status = page.locator(".cards .card").first.locator(".value").inner_text()
        assert status == "succeeded", page.content()[:3000]
        assert _plot_points(page, "plot-cdf_ttft") > 0
    finally:
        sim.stop()
    page.goto(server.url + "/")
    row = page.locator(f"#runs-table tr[data-run-id='{run_id}']")
    assert row.count() == 1 and "launched from the browser" in row.inner_text()
    assert con.errors == []


def test_runs_table_sorts_and_selects_for_compare(
    page: Page, server: DashboardServer, seeded: Seeded
) -> None:
    page.goto(server.url + "/")
    assert page.locator("#compare-btn").is_disabled()
    page.check(f"input.pick[value='{seeded.normal}']")
    page.check(f"input.pick[value='{seeded.one}']")
    assert page.locator("#compare-btn").is_enabled()
    page.click("th:has-text('TTFT p50')")
    assert page.locator("th.asc").count() == 1
    page.fill("#quick-filter", "all errors")
    visible = page.locator("#runs-table tbody tr:visible")
    assert visible.count() == 1
    page.fill("#quick-filter", "")
    with page.expect_navigation():
        page.click("#compare-btn")
    assert "/compare?" in page.url and page.locator("#compare-table").count() == 1


LIVE_STATE_JS = """() => {
  const label = document.querySelector('#live .progress .label');
  if (!label) return null;
  return [label.textContent, document.querySelector('#card-status .value').textContent,
          document.querySelector('#card-validity .value').textContent];
}"""


def test_live_run_page_has_one_source_of_state(
    page: Page, server: DashboardServer, seeded: Seeded
) -> None:
    """While a run runs, the status card says what the progress bar says (the poll updates
    both) and validity is "pending" until the run ends; then both are the run's own."""
    con = Console(page)
    with session_scope(seeded.sessions) as s:
        _, secret = auth.create_token(s, scopes=["run"], name="live")
    page.goto(f"{server.url}/signin?next=/launch")
    page.fill("#token", secret)
    with page.expect_navigation():
        page.click("#signin-form button[type=submit]")
    sim = start_simulator_thread(SimConfig(ttft_ms=5, itl_ms=2, seed=11))
    try:
        page.fill("#f-base_url", sim.base_url)
        page.fill("#f-name", "watched live")
        page.fill("#f-num_prompts", "200")
        page.fill("#f-request_rate", "20")  # about 10 s of sending: live when the page loads
        page.fill("#f-output_len", "16")
        page.fill("#f-input_len", "32")
        with page.expect_navigation():
            page.click("#launch-submit")
        assert page.locator("#live").count() == 1
        assert page.locator("#card-validity .value").inner_text() == "pending"
        seen: list[tuple[str, str, str]] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:  # one read of the three, so a reload in between cannot mix two pages
                snap = page.evaluate(LIVE_STATE_JS)
            except PlaywrightError:  # the page reloads when the job ends
                snap = []
            if snap is None:
                break
            if snap:
                seen.append((snap[0].strip(), snap[1].strip(), snap[2].strip()))
            time.sleep(0.3)
    finally:
        sim.stop()
    running = [x for x in seen if x[0].startswith("running:")]
    assert running, seen[:5]
    assert all(status == "running" for _, status, _ in running), running[:5]
    assert all(v == "pending" for _, _, v in seen), seen[:5]
    wait_js(page, "document.getElementById('live') === null", timeout_ms=60_000)
    assert page.locator("#card-status .value").inner_text() == "succeeded"
    assert page.locator("#card-validity .value").inner_text() in ("valid", "client-limited")
    assert con.errors == []
