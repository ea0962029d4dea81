"""Issue 17 journeys in headless Chromium, through the real pages: tag and annotate a run
and find it by the tag; save a baseline, pin it and see it on the compare page; delete a
run through its confirmation step; watch a run's live percentiles update and cancel it;
page and filter the runs list; sort the requests table by TTFT and walk a request page's
previous/next links. Set-up (tokens, runs) goes through storage; the actions under test
are clicks on the pages."""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from app.client.spec import RunSpec
from app.domain import RunStatus
from app.services import auth
from app.services.file_imports import import_path
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from tests.browser_support import (
    CHROMIUM,
    Console,
    DashboardServer,
    browser_missing,
    submit_refused,
    wait_js,
)
from tests.web_support import CSV_LOG, Seeded, seed

pytestmark = pytest.mark.slow
_MISSING = browser_missing()
if _MISSING:
    pytest.skip(f"browser tests skipped: {_MISSING}", allow_module_level=True)

from playwright.sync_api import Browser, Page, sync_playwright  # noqa: E402
from playwright.sync_api import Error as PlaywrightError  # noqa: E402

N_EXTRA = 55  # runs added so that the list has two pages (50 a page)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Seeded:
    out = seed(tmp_path_factory.mktemp("journeys"))
    with session_scope(out.sessions) as s:
        for i in range(N_EXTRA):
            repo.create_run(
                s,
                RunSpec(base_url="http://pad.test:8000", model="pad-model", num_prompts=1),
                name=f"pad-{i}",
                status=RunStatus.SUCCEEDED,
                created_at=dt.datetime(2025, 6, 1, tzinfo=dt.UTC) + dt.timedelta(hours=i),
            )
    return out


@pytest.fixture(scope="module")
def server(seeded: Seeded, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardServer]:
    srv = DashboardServer(seeded.url, tmp_path_factory.mktemp("logs") / "s.log", local_worker=True)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser(server: DashboardServer) -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    ctx = browser.new_context(viewport={"width": 1440, "height": 1000})
    pg = ctx.new_page()
    yield pg
    ctx.close()


def _sign_in(page: Page, server: DashboardServer, seeded: Seeded, next_path: str) -> None:
    with session_scope(seeded.sessions) as s:
        _, secret = auth.create_token(s, scopes=["run"], name="journeys")
    page.goto(f"{server.url}/signin?next={next_path}")
    page.fill("#token", secret)
    with page.expect_navigation():
        page.click("#signin-form button[type=submit]")
    assert page.url.endswith(next_path)


def _imported(seeded: Seeded, tmp: Any, name: str) -> str:
    f = tmp / f"{name}.csv"
    f.write_text(CSV_LOG)
    return import_path(seeded.sessions, "csv", f, name=name)[0]


def _submit(page: Page, selector: str) -> None:
    with page.expect_navigation():
        page.click(selector)


def test_tag_note_and_baseline_from_the_run_page(
    page: Page, server: DashboardServer, seeded: Seeded, tmp_path: Any
) -> None:
    con = Console(page)
    run_id = _imported(seeded, tmp_path, "journey-tags")
    with session_scope(seeded.sessions) as s:
        tags_before = list(repo.get_run(s, run_id).tags or [])
    _sign_in(page, server, seeded, f"/runs/{run_id}")
    # a tag too long: the message is beside the field, nothing is saved
    page.fill("#f-tags", "fine, " + "y" * 120)
    submit_refused(page, con, "#tags-save")
    assert "longer than 100 characters" in page.locator("#err-tags").inner_text()
    with session_scope(seeded.sessions) as s:
        assert repo.get_run(s, run_id).tags == tags_before
    page.fill("#f-tags", "h200, nightly")
    _submit(page, "#tags-save")
    assert page.locator("#flash").inner_text() == "Tags saved."
    assert page.locator("h1 .tag").all_inner_texts() == ["h200", "nightly"]
    page.fill("#f-note", "after the driver update")
    _submit(page, "#note-save")
    assert page.locator("#flash").inner_text() == "Note saved."
    assert page.locator("#run-note").inner_text() == "after the driver update"
    # the runs list: follow the tag, then filter by it in the form
    _submit(page, "h1 a.tag:has-text('nightly')")
    assert page.locator(f"#runs-table tr[data-run-id='{run_id}']").count() == 1
    assert page.locator("#runs-table tbody tr[data-run-id]").count() == 1
    page.goto(server.url + "/")
    page.fill("#f-tag", "h200")
    _submit(page, "#filter-submit")
    assert "tag=h200" in page.url
    assert page.locator("#runs-table tbody tr[data-run-id]").count() == 1
    assert "1–1 of 1 matching" in page.locator("#runs-count").inner_text()
    # a baseline: an empty name first (named error), then saved and pinned
    page.goto(f"{server.url}/runs/{run_id}")
    page.fill("#f-baseline_name", "   ")
    submit_refused(page, con, "#baseline-save")
    assert "baseline name:" in page.locator("#err-baseline_name").inner_text()
    page.fill("#f-baseline_name", "journey-base")
    _submit(page, "#baseline-save")
    assert page.locator("#flash").inner_text() == "Baseline saved."
    row = page.locator("#baselines-table tr[data-baseline='journey-base']")
    assert "not pinned" in row.inner_text()
    _submit(page, "#baselines-table tr[data-baseline='journey-base'] button.pin-toggle")
    assert page.locator("#flash").inner_text() == "Baseline pinned."
    assert "pinned" in row.inner_text() and "not pinned" not in row.inner_text()
    with session_scope(seeded.sessions) as s:
        b = compare_repo.current_baseline(s, "journey-base")
        assert b is not None and b.pinned and b.run_id == run_id
    _submit(page, "#baselines-table tr[data-baseline='journey-base'] a")
    assert "/compare?" in page.url
    assert page.locator("#baseline-select option[value='journey-base']").count() == 1
    assert con.problems() == []


def test_delete_through_the_confirmation(
    page: Page, server: DashboardServer, seeded: Seeded, tmp_path: Any
) -> None:
    con = Console(page)
    run_id = _imported(seeded, tmp_path, "journey-delete")
    _sign_in(page, server, seeded, f"/runs/{run_id}")
    _submit(page, "#delete-run")
    assert page.url.endswith(f"/runs/{run_id}/delete")
    submit_refused(page, con, "#delete-submit")  # the word not typed: refused, still there
    assert "confirm: type" in page.locator("#err-confirm").inner_text()
    with session_scope(seeded.sessions) as s:
        assert repo.find_run(s, run_id) is not None
    page.fill("#f-confirm", "delete")
    _submit(page, "#delete-submit")
    assert page.locator("#flash").inner_text() == f"Run {run_id} deleted."
    assert page.locator(f"#runs-table tr[data-run-id='{run_id}']").count() == 0
    with session_scope(seeded.sessions) as s:
        assert repo.find_run(s, run_id) is None
    assert con.problems() == []


LIVE_JS = """() => {
  const cell = (id) => { const e = document.getElementById(id); return e ? e.textContent : null; };
  return {stored: cell('live-stored'), ttft50: cell('live-ttft-p50'), ttft99: cell('live-ttft-p99'),
          e2e50: cell('live-e2e-p50'), reqs: cell('live-req-s'), toks: cell('live-tok-s')};
}"""


def test_live_percentiles_update_then_cancel(
    page: Page, server: DashboardServer, seeded: Seeded
) -> None:
    con = Console(page)
    sim = start_simulator_thread(SimConfig(ttft_ms=20, itl_ms=15, seed=4))
    try:
        _sign_in(page, server, seeded, "/launch")
        page.fill("#f-base_url", sim.base_url)
        page.fill("#f-name", "watched and cancelled")
        page.fill("#f-num_prompts", "2000")
        page.fill("#f-request_rate", "10")  # about 200 s: cancelled long before
        page.fill("#f-output_len", "16")
        page.fill("#f-input_len", "32")
        _submit(page, "#launch-submit")
        m = re.search(r"/runs/([0-9a-f]+)$", page.url)
        assert m, page.url
        run_id = m.group(1)
        seen: list[dict[str, str]] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            snap = page.evaluate(LIVE_JS)
            filled = snap["stored"] and snap["ttft50"] not in (None, "—")
            if filled and (not seen or snap["stored"] != seen[-1]["stored"]):
                seen.append(snap)
            if len(seen) >= 2:
                break
            time.sleep(0.3)
        assert len(seen) >= 2, seen  # the panel filled, then changed as requests came in
        assert int(seen[1]["stored"]) > int(seen[0]["stored"])
        for snap in seen:
            assert float(snap["ttft50"]) >= 20.0  # the simulator's TTFT is at least 20 ms
            assert float(snap["ttft99"]) >= float(snap["ttft50"])
            assert float(snap["e2e50"]) > float(snap["ttft50"])
            assert float(snap["reqs"]) > 0 and float(snap["toks"]) > 0
        _submit(page, "#live-cancel")
        assert "Cancel requested" in page.locator("#flash").inner_text() or (
            "Run cancelled." in page.locator("#flash").inner_text()
        )
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline:
            with session_scope(seeded.sessions) as s:
                status = str(repo.get_run(s, run_id).status)
            if status not in ("queued", "running"):
                break
            time.sleep(0.3)
        assert status in ("cancelled", "partial"), status
        with session_scope(seeded.sessions) as s:
            n = repo.count_requests(s, run_id)
        assert n < 2000
    finally:
        sim.stop()
    try:
        wait_js(page, "document.getElementById('live') === null", timeout_ms=30_000)
    except PlaywrightError:
        page.reload()
    assert page.locator("#card-status .value").inner_text() in ("cancelled", "partial")
    assert con.problems() == []


def test_runs_list_pages_filters_and_fits_1440(
    page: Page, server: DashboardServer, seeded: Seeded
) -> None:
    con = Console(page)
    page.goto(server.url + "/")
    rows = page.locator("#runs-table tbody tr[data-run-id]")
    assert rows.count() == 50
    count = page.locator("#runs-count").inner_text()
    m = re.match(r"1–50 of (\d+) matching", count)
    assert m and int(m.group(1)) > 50
    # the errors column is in view at 1440 px without scrolling the table sideways
    box = page.locator("#th-errors").bounding_box()
    assert box is not None and box["x"] + box["width"] <= 1440, box
    first_page = set(rows.evaluate_all("(rs) => rs.map((r) => r.dataset.runId)"))
    _submit(page, "#page-next")
    assert "page=2" in page.url
    second = set(rows.evaluate_all("(rs) => rs.map((r) => r.dataset.runId)"))
    assert second and not (first_page & second)
    assert page.locator("#runs-count").inner_text().startswith("51–")
    _submit(page, "#page-prev")
    # filter by model in the form: only the padding runs, two pages of them
    page.fill("#f-model", "pad-model")
    _submit(page, "#filter-submit")
    assert f"1–50 of {N_EXTRA} matching" in page.locator("#runs-count").inner_text()
    _submit(page, "#page-next")
    assert "model=pad-model" in page.url and "page=2" in page.url
    assert rows.count() == N_EXTRA - 50
    names = rows.evaluate_all("(rs) => rs.map((r) => r.querySelector('td a').textContent)")
    assert names == [f"pad-{i}" for i in range(N_EXTRA - 51, -1, -1)]  # the oldest, newest first
    # a date range: the padding runs were created on 2025-06-01..03
    page.goto(server.url + "/")
    page.fill("#f-since", "2025-06-02")
    page.fill("#f-until", "2025-06-02")
    _submit(page, "#filter-submit")
    assert "1–24 of 24 matching" in page.locator("#runs-count").inner_text()
    page.select_option("#f-status", "failed")
    _submit(page, "#filter-submit")
    assert page.locator("#runs-table tbody tr[data-run-id]").count() == 0
    assert con.problems() == []


def test_sort_requests_by_ttft_and_walk_next_previous(
    page: Page, server: DashboardServer, seeded: Seeded
) -> None:
    con = Console(page)
    page.goto(f"{server.url}/runs/{seeded.normal}/requests")
    _submit(page, "#sort-ttft")  # first click on a latency column: slowest first
    assert "sort=ttft" in page.url and "dir=desc" in page.url
    cells = page.locator("#requests-table tbody tr td:nth-child(4)").all_inner_texts()
    values = [float(c.replace(",", "")) for c in cells if c.strip() != "—"]
    assert len(values) > 10 and values == sorted(values, reverse=True)
    assert all(c.strip() == "—" for c in cells[len(values) :])  # no TTFT (failures) last
    order = [
        int(x)
        for x in page.locator("#requests-table tbody tr").evaluate_all(
            "(rs) => rs.map((r) => r.dataset.idx)"
        )
    ]
    _submit(page, f"#requests-table tbody tr[data-idx='{order[0]}'] a")
    assert page.url.endswith(f"/requests/{order[0]}?sort=ttft&dir=desc")
    assert page.locator("#request-prev").count() == 0
    _submit(page, "#request-next")
    assert page.url.endswith(f"/requests/{order[1]}?sort=ttft&dir=desc")
    assert page.locator("#request-position").inner_text().startswith("2 of 60")
    _submit(page, "#request-next")
    assert page.url.endswith(f"/requests/{order[2]}?sort=ttft&dir=desc")
    _submit(page, "#request-prev")
    assert page.url.endswith(f"/requests/{order[1]}?sort=ttft&dir=desc")
    _submit(page, "#back-to-table")
    assert "sort=ttft" in page.url and "dir=desc" in page.url
    # clicking the sorted header again flips it to ascending
    _submit(page, "#sort-ttft")
    assert "dir=asc" in page.url
    cells = page.locator("#requests-table tbody tr td:nth-child(4)").all_inner_texts()
    values = [float(c.replace(",", "")) for c in cells if c.strip() != "—"]
    assert values == sorted(values)
    # a filter from the form: failed requests only
    page.select_option("#f-status", "failed")
    _submit(page, "#requests-filter-submit")
    statuses = page.locator("#requests-table tbody tr td:nth-child(2)").all_inner_texts()
    assert statuses and all(s.strip() != "ok" for s in statuses)
    assert con.problems() == []
