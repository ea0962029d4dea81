"""The comparison page in headless Chromium: comparability first, verdicts, overlaid CDFs,
and the options form."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.services.runs import open_database
from app.targets.sim_config import SimConfig
from tests.browser_support import CHROMIUM, DashboardServer, browser_missing, wait_js
from tests.web_support import bench

pytestmark = pytest.mark.slow
Runs = tuple[str, str, str, str, str]  # db url, fast, slow, fp8, client-limited
_MISSING = browser_missing()
if _MISSING:
    pytest.skip(f"browser tests skipped: {_MISSING}", allow_module_level=True)

from playwright.sync_api import Page, sync_playwright  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str, str, str]:
    tmp: Path = tmp_path_factory.mktemp("cmp")
    url = f"sqlite:///{tmp / 'cmp.db'}"
    sessions = open_database(url)
    # a loaded test box can make any client fall 10 ms behind: these three must stay valid
    ok = {"num_prompts": 60, "client_lag_bound_ms": 1000.0}
    fast = bench(sessions, SimConfig(ttft_ms=30, itl_ms=2, seed=1), "fast", **ok)
    slow = bench(sessions, SimConfig(ttft_ms=90, itl_ms=2, seed=1), "slow", **ok)
    other = bench(
        sessions, SimConfig(ttft_ms=30, itl_ms=2, seed=1), "fp8", dtype="fp8", seed=9, **ok
    )
    limited = bench(
        sessions, SimConfig(ttft_ms=30, itl_ms=2, seed=1), "limited", num_prompts=60,
        client_lag_bound_ms=0.001,  # any send lag is over this bound: a client-limited run
    )  # fmt: skip
    return url, fast, slow, other, limited


@pytest.fixture(scope="module")
def page(runs: Runs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Page, str]]:
    srv = DashboardServer(runs[0], tmp_path_factory.mktemp("log") / "s.log", local_worker=False)
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            pg = b.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            yield pg, srv.url
            b.close()
    finally:
        srv.stop()


def _points(page: Page, div_id: str) -> int:
    js = """(id) => { const d = document.getElementById(id);
      if (!d || !d.data) return -1;
      return d.data.reduce((n, t) => n + ((t.x || []).length), 0); }"""
    return int(page.evaluate(js, div_id))


def test_comparison_page(page: tuple[Page, str], runs: Runs) -> None:
    pg, base = page
    _, fast, slow, _other, _ = runs
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    resp = pg.goto(f"{base}/compare?ids={fast}&ids={slow}")
    assert resp is not None and resp.status == 200
    pg.wait_for_load_state("load")
    assert "same workload and setup" in pg.locator("#comparability-message").inner_text()
    cell = pg.locator('td.verdict-cell[data-metric="ttft_ms"][data-p="p50"]')
    assert cell.get_attribute("data-verdict") == "regressed"
    assert "regressed" in pg.locator("#overall-verdict").inner_text()
    wait_js(pg, "() => !!document.getElementById('plot-cdf_ttft_ms').data")
    assert _points(pg, "plot-cdf_ttft_ms") > 100  # two overlaid CDFs
    assert int(pg.evaluate("document.getElementById('plot-cdf_ttft_ms').data.length")) == 2
    # a huge threshold turns every verdict into "no significant change"
    pg.fill("#threshold", "500")
    pg.click("#compare-options button[type=submit]")
    pg.wait_for_load_state("load")
    assert "threshold_pct=500" in pg.url
    assert pg.locator('td.verdict-cell[data-verdict="regressed"]').count() == 0
    assert errors == []


def test_comparability_warning_comes_before_verdicts(page: tuple[Page, str], runs: Runs) -> None:
    pg, base = page
    _, fast, _, other, _ = runs
    pg.goto(f"{base}/compare?ids={fast}&ids={other}")
    msg = pg.locator("#comparability-message").inner_text()
    assert "not a one-variable comparison" in msg and "dtype" in msg and "seed" in msg
    order = pg.evaluate(
        "() => document.getElementById('comparability').compareDocumentPosition("
        "document.getElementById('compare-table'))"
    )
    assert int(order) & 4  # DOCUMENT_POSITION_FOLLOWING: the table comes after
    rows = pg.locator("#key-diff tbody tr").all_inner_texts()
    assert any("dtype" in r and "fp8" in r for r in rows)


def _heading(pg: Page) -> str:
    return " ".join(pg.locator("#compare-heading").inner_text().split())


def test_the_user_chooses_the_baseline(page: tuple[Page, str], runs: Runs) -> None:
    """Ticked in table order (newest first) the new run used to become the baseline and
    every verdict flipped. The oldest is the default; a radio button picks another."""
    pg, base = page
    _, fast, slow, _, _ = runs
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.goto(f"{base}/compare?ids={slow}&ids={fast}")  # slow listed first, fast is older
    assert _heading(pg).startswith("fast (baseline) vs slow")
    cell = 'td.verdict-cell[data-metric="ttft_ms"][data-p="p50"]'
    assert pg.locator(cell).get_attribute("data-verdict") == "regressed"
    pg.check(f"#base-{slow}")
    with pg.expect_navigation():
        pg.click("#compare-options button[type=submit]")
    assert f"base={slow}" in pg.url
    assert _heading(pg).startswith("slow (baseline) vs fast")
    assert pg.locator(cell).get_attribute("data-verdict") == "improved"
    assert pg.locator(f"#base-{slow}").is_checked()
    # from the runs list: tick two runs and the baseline's radio button
    pg.goto(base + "/")
    pg.check(f"input.pick[value='{fast}']")
    pg.check(f"input.base-pick[value='{slow}']")  # ticks its compare box too
    assert pg.locator(f"input.pick[value='{slow}']").is_checked()
    assert "baseline: slow" in pg.locator("#compare-count").inner_text()
    with pg.expect_navigation():
        pg.click("#compare-btn")
    assert _heading(pg).startswith("slow (baseline) vs fast")
    assert pg.locator(cell).get_attribute("data-verdict") == "improved"
    assert errors == []


def test_a_client_limited_run_is_flagged_wherever_it_is_shown(
    page: tuple[Page, str], runs: Runs
) -> None:
    pg, base = page
    _, fast, _, _, limited = runs
    pg.goto(f"{base}/compare?ids={fast}&ids={limited}")
    warn = pg.locator("#compare-warnings")
    assert warn.count() == 1 and "client-limited" in warn.inner_text()
    assert "limited" in warn.locator(f"li[data-run-id='{limited}']").inner_text()
    assert warn.locator(f"li[data-run-id='{fast}']").count() == 0
    assert "not to be trusted" in pg.locator("#verdict-caveat").inner_text()
    assert pg.locator("td.pair-verdict").get_attribute("data-untrusted") == "yes"
    order = pg.evaluate(
        "() => document.getElementById('compare-warnings').compareDocumentPosition("
        "document.getElementById('compare-table'))"
    )
    assert int(order) & 4  # the warning comes before the verdicts
    pg.goto(f"{base}/compare?ids={fast}&ids={runs[2]}")  # two trustworthy runs: no warning
    assert pg.locator("#compare-warnings").count() == 0
    assert pg.locator("td.pair-verdict").get_attribute("data-untrusted") == "no"
    pg.goto(base + "/")
    row = pg.locator(f"#runs-table tr[data-run-id='{limited}']")
    assert "⚠ client-limited" in row.inner_text()
    assert pg.locator(f"#runs-table tr[data-run-id='{fast}'] .trust-warning").count() == 0
    pg.goto(f"{base}/runs/{limited}")
    assert "client-limited" in pg.locator("#trust-warnings").inner_text()
    assert pg.locator("#card-validity .value").inner_text() == "client-limited"
