"""Issue 24 items 5, 7 and 8 drawn in headless Chromium: a noisy probe flagged on its page,
in the probe list and on the roofline; the capacity form refusing a tensor-parallel size
vLLM refuses, beside the field; a CSV log in milliseconds imported through the import page
with its unit; an imported AIPerf multi-turn file's by-turn table."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.services.file_imports import import_text
from app.services.runs import open_database
from tests.browser_support import (
    CHROMIUM,
    Console,
    DashboardServer,
    assert_drawn,
    browser_missing,
    sign_in,
    submit_refused,
)
from tests.live_server import make_token
from tests.probe_spread_support import ceilings_result, store_probe
from tests.test_csv_units import example_b
from tests.test_import_turns import aiperf_multi_turn

pytestmark = pytest.mark.slow
_MISSING = browser_missing()
if _MISSING:
    pytest.skip(f"browser tests skipped: {_MISSING}", allow_module_level=True)

from playwright.sync_api import Browser, Page, sync_playwright  # noqa: E402


@dataclass(frozen=True)
class Lab:
    url: str
    noisy: str
    steady: str
    multi_turn: str
    run_token: str


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    url = f"sqlite:///{tmp_path_factory.mktemp('defs') / 'defs.db'}"
    sessions = open_database(url)
    noisy = store_probe(sessions, ceilings_result(noisy=True), name="busy", device="GPU-N")
    steady = store_probe(sessions, ceilings_result(noisy=False), name="idle", device="GPU-S")
    text, _ = aiperf_multi_turn()
    (multi,) = import_text(sessions, "aiperf", text, file_name="mt.jsonl")
    return Lab(url, noisy, steady, multi, make_token(url, "run", name="browser"))


@pytest.fixture(scope="module")
def server(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardServer]:
    srv = DashboardServer(lab.url, tmp_path_factory.mktemp("logs") / "s.log", local_worker=False)
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
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    yield pg
    ctx.close()


def _open(page: Page, server: DashboardServer, path: str, status: int = 200) -> Console:
    con = Console(page)
    resp = page.goto(server.url + path)
    assert resp is not None and resp.status == status, path
    return con


def _visible_box(page: Page, selector: str) -> dict[str, float]:
    loc = page.locator(selector)
    assert loc.count() >= 1 and loc.first.is_visible(), selector
    box = loc.first.bounding_box()
    assert box is not None and box["width"] > 0 and box["height"] > 0, selector
    return box


def test_noisy_probe_is_flagged_where_it_is_shown(
    page: Page, server: DashboardServer, lab: Lab
) -> None:
    con = _open(page, server, f"/probes/{lab.noisy}")
    _visible_box(page, "#spread-warning")
    warning = page.inner_text("#spread-warning")
    assert "Do not trust these figures" in warning and "485%" in warning
    assert "copy 256 MiB" in warning and "bandwidth" in warning
    _visible_box(page, "#bandwidth-table td.noisy")
    cell = page.locator("#bandwidth-table td.noisy")
    assert cell.count() == 1 and "noisy" in cell.inner_text()
    color = page.evaluate(
        "() => getComputedStyle(document.querySelector('#bandwidth-table td.noisy')).color"
    )
    assert color == "rgb(198, 40, 40)"  # var(--bad), as a failed run's figures
    assert con.problems() == []
    con = _open(page, server, f"/probes/{lab.steady}")
    assert page.locator("#spread-warning").count() == 0
    assert page.locator("td.noisy").count() == 0
    con = _open(page, server, "/probes")
    tags = page.locator("#probes-table .tag.noisy")
    assert tags.count() == 1 and tags.first.is_visible()
    assert "noisy: spread 485.0%" in tags.first.inner_text()
    assert con.problems() == []


def test_roofline_says_its_ceilings_are_noisy(
    page: Page, server: DashboardServer, lab: Lab
) -> None:
    con = _open(page, server, "/roofline?device=GPU-N")
    _visible_box(page, "#ceilings-noisy")
    assert lab.noisy in page.inner_text("#ceilings-noisy")
    found = assert_drawn(page, expect=1)
    assert "(noisy)" in str(found[0]["text"])  # the legend names the noisy roofs
    assert con.problems() == []
    _open(page, server, "/roofline?device=GPU-S")
    assert page.locator("#ceilings-noisy").count() == 0
    assert "(noisy)" not in str(assert_drawn(page, expect=1)[0]["text"])


def test_capacity_form_refuses_a_tp_vllm_refuses(
    page: Page, server: DashboardServer, lab: Lab
) -> None:
    con = _open(page, server, "/capacity")
    page.select_option("#f-model", "llama-3-70b")
    page.fill("#f-tp", "3")
    submit_refused(page, con, "#capacity-submit")
    _visible_box(page, "#err-tp")
    assert "3 GPUs do not divide the model's 64 attention heads" in page.inner_text("#err-tp")
    assert page.locator("#max-concurrency").count() == 0
    page.fill("#f-tp", "4")
    with page.expect_navigation():
        page.click("#capacity-submit")
    assert page.locator("#err-tp").count() == 0
    assert int(page.inner_text("#max-concurrency").replace(",", "")) > 0
    assert con.problems() == []


def test_csv_in_milliseconds_through_the_import_page(
    page: Page, server: DashboardServer, lab: Lab, tmp_path: Path
) -> None:
    f = tmp_path / "ms.csv"
    f.write_text(example_b(1e3))
    con = Console(page)
    sign_in(page, server, lab.run_token, "/import")
    _visible_box(page, "#f-time-unit")
    page.select_option("#f-format", "csv")
    page.set_input_files("#f-file", str(f))
    submit_refused(page, con, "#import-form button[type=submit]")  # read as seconds: refused
    err = page.inner_text("#form-error")
    assert "row 1 (r1)" in err and "10 s bound" in err
    page.select_option("#f-format", "csv")
    page.select_option("#f-time-unit", "ms")
    page.set_input_files("#f-file", str(f))
    with page.expect_navigation():
        page.click("#import-form button[type=submit]")
    assert "/runs/" in page.url
    assert "times read in milliseconds" in page.inner_text("body")
    # TTFT p50 by hand: 420, 560, 480 ms -> 480
    row = page.locator("#pct-table tbody tr", has_text="TTFT").first
    assert "480" in row.inner_text()
    assert con.problems() == []


def test_imported_multi_turn_run_draws_its_turn_table(
    page: Page, server: DashboardServer, lab: Lab
) -> None:
    con = _open(page, server, f"/runs/{lab.multi_turn}")
    _visible_box(page, "#turn-table")
    rows = page.locator("#turn-table tbody tr")
    assert rows.count() == 3
    assert [rows.nth(i).get_attribute("data-turn") for i in range(3)] == ["1", "2", "3"]
    assert "4 / 4" in rows.nth(0).inner_text()
    assert con.problems() == []
