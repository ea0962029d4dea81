"""A multi-turn run's page in headless Chromium behind the app's strict CSP: the per-turn
charts (TTFT and TTFT per prompt token by turn) drawn by Plotly as SVG, one trace group per
trace, every other chart too, and no console error or CSP violation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.services.runs import open_database
from app.targets.sim_config import SimConfig
from tests.browser_support import CHROMIUM, Console, DashboardServer, assert_drawn, browser_missing
from tests.web_support import bench

pytestmark = pytest.mark.slow
_MISSING = browser_missing()
if _MISSING:
    pytest.skip(f"browser tests skipped: {_MISSING}", allow_module_level=True)

from playwright.sync_api import sync_playwright  # noqa: E402


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DashboardServer, str]]:
    tmp: Path = tmp_path_factory.mktemp("browser-turns")
    path = tmp / "conv.jsonl"
    convs = [["a b c d", "e f g", "h i"], ["j k l m n", "o p"]]
    path.write_text("".join(json.dumps({"turns": c}) + "\n" for c in convs))
    url = f"sqlite:///{tmp / 'b.db'}"
    run_id = bench(
        open_database(url), SimConfig(ttft_ms=6, itl_ms=1, seed=2), "multi-turn",
        dataset="jsonl", dataset_path=str(path), multi_turn=True, endpoint="chat",
        num_prompts=4, output_len=4, request_rate=40.0,
    )  # fmt: skip
    srv = DashboardServer(url, tmp / "server.log", local_worker=False)
    try:
        yield srv, run_id
    finally:
        srv.stop()


def test_turn_charts_are_drawn_and_the_console_is_clean(
    served: tuple[DashboardServer, str],
) -> None:
    srv, run_id = served
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            con = Console(page)
            resp = page.goto(f"{srv.url}/runs/{run_id}")
            assert resp is not None and resp.status == 200
            csp = resp.headers.get("content-security-policy", "")
            assert "script-src 'self';" in csp  # the app's strict CSP: no inline script
            found = {c["id"]: c for c in assert_drawn(page)}
            for key in ("plot-turn_ttft", "plot-turn_ttft_per_token"):
                chart = found[key]
                assert not chart["hidden"] and chart["expected"] == 2  # p50 and p99
                assert chart["drawn"] == 2 and chart["points"] > 0, chart
                assert "turn index" in str(chart["text"])
            rows = page.locator("#turn-table tbody tr")
            assert rows.count() == 3  # turns 1, 2, 3
            assert (
                page.locator("#turn-table tbody tr").first.locator("td").first.inner_text() == "1"
            )
            assert page.locator("#turns-csv").get_attribute("href") == f"/runs/{run_id}/turns.csv"
            assert con.problems() == []
        finally:
            browser.close()
