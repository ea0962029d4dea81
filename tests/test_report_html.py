"""The single-file HTML report of a run and of a comparison: its numbers are the run's
(recomputed with numpy from the imported log), it holds plotly.js and every figure, a run
still running is refused naming its state (409 / exit 2), and, opened from disk in
headless Chromium with every network request aborted, every chart draws with a clean
console."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.cli.main import main
from app.client.spec import RunSpec
from app.domain import RunStatus
from app.services.runs import open_database
from app.storage import repository as repo
from app.storage.db import session_scope
from app.targets.sim_config import SimConfig
from app.web import report_html
from tests.browser_support import CHROMIUM, Console, assert_drawn, browser_missing, wait_js
from tests.series_support import import_run
from tests.web_support import bench, web_app

TTFTS = [120.0, 80.0, 95.5, 101.25, 150.0, 99.0]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("report")
    url = f"sqlite:///{tmp / 'r.db'}"
    sessions = open_database(url)
    imported = import_run(sessions, tmp, TTFTS, name="imported <b>log</b>")
    other = import_run(sessions, tmp, [x * 1.5 for x in TTFTS], name="slower")
    sim = bench(sessions, SimConfig(ttft_ms=10, itl_ms=1, seed=1), "sim run", num_prompts=12,
                request_rate=100.0, input_len=16, output_len=8)  # fmt: skip
    with session_scope(sessions) as s:
        running = repo.create_run(
            s, RunSpec(base_url="http://127.0.0.1:9", model="m"), status=RunStatus.RUNNING
        )
    run_file, cmp_file = tmp / "run.html", tmp / "cmp.html"
    assert main(["report", sim, "--html", str(run_file), "--database-url", url]) == 0
    assert main(["report", "--compare", imported, other, "--html", str(cmp_file),
                 "--database-url", url]) == 0  # fmt: skip
    yield {"url": url, "imported": imported, "other": other, "sim": sim, "running": running,
           "run_file": str(run_file), "cmp_file": str(cmp_file), "tmp": str(tmp)}  # fmt: skip


def test_run_report_holds_the_runs_numbers(lab: dict[str, str]) -> None:
    sessions = open_database(lab["url"])
    text = report_html.run_report(sessions, lab["imported"])
    assert text.startswith("<!doctype html>")
    assert "<script>/**\n* plotly.js" in text  # inlined, not linked
    assert "<script src" not in text and "<link " not in text  # nothing fetched
    ms = np.asarray(TTFTS)
    row = re.search(r"<td>TTFT</td>(.*?)</tr>", text, re.S)
    assert row is not None
    for p in (50, 90, 99):
        assert f"{np.percentile(ms, p):,.2f}" in row.group(1), p
    assert "imported &lt;b&gt;log&lt;/b&gt;" in text  # names escaped
    assert 'id="fig-cdf_ttft"' in text and 'id="fig-timeline"' in text


def test_compare_report_holds_the_verdicts(lab: dict[str, str]) -> None:
    text = Path(lab["cmp_file"]).read_text()
    assert 'id="compare-table"' in text and 'id="overall-verdict"' in text
    assert 'id="fig-cdf_ttft_ms"' in text and 'id="fig-delta_0"' in text
    ms = np.asarray(TTFTS)
    assert f"{np.percentile(ms, 50):,.2f} ms" in text
    assert f"{np.percentile(ms * 1.5, 50):,.2f} ms" in text


def test_a_running_run_is_refused(lab: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    out = Path(lab["tmp"]) / "no.html"
    rc = main(["report", lab["running"], "--html", str(out), "--database-url", lab["url"]])
    assert rc == 2 and not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"run {lab['running']!r} is running" in err[0]
    rc = main(["report", "--compare", lab["imported"], lab["running"], "--html", str(out),
               "--database-url", lab["url"]])  # fmt: skip
    assert rc == 2 and not out.exists()
    with pytest.raises(SystemExit) as exited:  # argparse: one BASELINE RUN pair
        main(["report", "--compare", lab["imported"], "--html", str(out)])
    assert exited.value.code == 2
    assert main(["report", "nope", "--html", str(out), "--database-url", lab["url"]]) == 2
    from fastapi.testclient import TestClient

    with TestClient(web_app(lab["url"])) as c:
        r = c.get(f"/runs/{lab['running']}/report.html")
        assert r.status_code == 409 and "is running" in r.text
        r = c.get(f"/runs/{lab['sim']}/report.html")
        assert r.status_code == 200
        assert r.headers["content-disposition"] == (
            f'attachment; filename="tokentrace-run-{lab["sim"]}.html"'
        )
        r = c.get("/compare/report.html", params={"ids": [lab["imported"], lab["other"]]})
        assert r.status_code == 200 and 'id="compare-table"' in r.text
        assert c.get("/compare/report.html", params={"ids": [lab["imported"]]}).status_code == 422
        page = c.get(f"/runs/{lab['sim']}").text
        assert f'href="/runs/{lab["sim"]}/report.html"' in page
        assert 'id="download-report"' not in c.get(f"/runs/{lab['running']}").text
        cmp = c.get("/compare", params={"ids": [lab["imported"], lab["other"]]}).text
        assert "/compare/report.html?ids=" in cmp


_MISSING = browser_missing()


@pytest.mark.slow
@pytest.mark.skipif(_MISSING is not None, reason=f"browser tests skipped: {_MISSING}")
def test_reports_draw_offline_in_chromium(lab: dict[str, str]) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            for key, expect in (("run_file", None), ("cmp_file", 5)):  # 1 delta + 4 CDFs
                uri = Path(lab[key]).as_uri()
                ctx = browser.new_context(offline=True)
                asked: list[str] = []

                def cut(route: Any, request: Any, asked: list[str] = asked, uri: str = uri) -> None:
                    if request.url == uri:  # the file itself, from disk
                        route.continue_()
                        return
                    asked.append(request.url)  # anything else: aborted, and the test fails
                    route.abort()

                ctx.route("**/*", cut)
                page = ctx.new_page()
                con = Console(page)
                page.goto(uri)
                wait_js(page, "() => document.body.dataset.plotsDrawn === '1'")
                found = assert_drawn(page, expect)
                assert len(found) >= 5, [c["id"] for c in found]
                assert all(not c["hidden"] for c in found)
                assert con.problems() == [], con.problems()
                assert asked == [], asked  # nothing went out
                ctx.close()
        finally:
            browser.close()
