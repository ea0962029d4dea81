"""The series pages, the series picker on the launch and sweep forms, and the run page's
series line: server-rendered (TestClient), then in headless Chromium behind the strict CSP
(the trend chart draws, a click on a point opens its run, a clean console)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.services import series as series_svc
from app.services.runs import open_database
from app.storage.db import session_scope
from tests.browser_support import (
    CHROMIUM,
    Console,
    DashboardServer,
    assert_drawn,
    browser_missing,
    wait_js,
)
from tests.live_server import make_token
from tests.series_support import import_run, p99, shifted
from tests.web_support import post_form, sign_in, web_app


@dataclass(frozen=True)
class Pages:
    url: str
    ids: list[str]
    ttfts: list[list[float]]
    flagged: str


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Pages:
    tmp = tmp_path_factory.mktemp("series-pages")
    url = f"sqlite:///{tmp / 'p.db'}"
    sessions = open_database(url)
    ttfts = shifted(12, 7, seed=5)
    ids = []
    for i, t in enumerate(ttfts):
        rid = import_run(sessions, tmp, t, name=f"nightly <i>{i}</i>")
        with session_scope(sessions) as s:
            series_svc.join_run(s, "web.series", rid)
        series_svc.settle_run(sessions, rid)
        ids.append(rid)
    flagged = import_run(sessions, tmp, [100.0] * 6, name="longer", input_tokens=900)
    series_svc.move(sessions, flagged, "web.series")
    return Pages(url, ids, ttfts, flagged)


@pytest.fixture(scope="module")
def client(pages: Pages) -> Iterator[TestClient]:
    with TestClient(web_app(pages.url)) as c:
        yield c


def test_series_list_and_page(client: TestClient, pages: Pages) -> None:
    r = client.get("/series")
    assert r.status_code == 200 and 'href="/series/web.series"' in r.text
    assert 'href="/series"' in r.text  # the nav
    r = client.get("/series/web.series", params={"metric": "ttft:p99"})
    assert r.status_code == 200, r.text
    m = re.search(r'<script type="application/json" id="fig-trend">(.*?)</script>', r.text, re.S)
    assert m is not None
    fig = json.loads(m.group(1))
    runs = next(t for t in fig["data"] if t["name"] == "runs")
    assert runs["customdata"] == pages.ids  # click -> run
    assert runs["y"] == pytest.approx([p99(t) for t in pages.ttfts], abs=1e-3)
    flag = next(t for t in fig["data"] if t["name"].startswith("flagged"))
    assert flag["customdata"] == [pages.flagged]
    assert len(fig["layout"]["shapes"]) == 1  # one change point, marked
    rows = re.findall(r'<tr data-index="(\d+)">', r.text)
    assert rows == ["7"]
    assert f'href="/runs/{pages.ids[6]}"' in r.text and f'href="/runs/{pages.ids[7]}"' in r.text
    assert f'data-run-id="{pages.flagged}" data-state="flagged"' in r.text
    assert "nightly &lt;i&gt;3&lt;/i&gt;" in r.text  # names escaped
    assert client.get("/series/nope").status_code == 404
    assert client.get("/series/bad%20name").status_code == 422
    r = client.get("/series/web.series", params={"metric": "ttft:p3"})
    assert r.status_code == 422
    run_page = client.get(f"/runs/{pages.flagged}").text
    assert 'id="run-series"' in run_page and "flagged" in run_page


def test_launch_and_sweep_forms_pick_a_series(pages: Pages) -> None:
    token = make_token(pages.url, "run", "read")
    with TestClient(web_app(pages.url)) as c:
        sign_in(c, token)
        form = c.get("/launch").text
        assert 'id="f-series"' in form and '<option value="web.series">' in form
        assert '<option value="web.series">' in c.get("/launch/sweep").text
        base = {"base_url": "http://127.0.0.1:9", "model": "m", "num_prompts": "3"}
        r = post_form(c, "/launch", base | {"series": "bad name!"})
        assert r.status_code == 422 and 'id="err-series"' in r.text
        before = c.get("/api/v1/runs").json()["total"]
        r = post_form(c, "/launch", base | {"series": "from-form"}, follow_redirects=False)
        assert r.status_code == 303, r.text
        run_id = r.headers["location"].rsplit("/", 1)[1]
        assert c.get("/api/v1/runs").json()["total"] == before + 1
        detail = c.get("/api/v1/series/from-form").json()
        assert [(x["run_id"], x["state"]) for x in detail["runs"]] == [(run_id, "pending")]
        sweep = base | {"sweep_mode": "rates", "loads": "1, 2", "series": "sweeps-form"}
        r = post_form(c, "/launch/sweep", sweep, follow_redirects=False)
        assert r.status_code == 303, r.text
        assert c.get("/api/v1/series/sweeps-form").status_code == 200


_MISSING = browser_missing()


@pytest.fixture(scope="module")
def server(pages: Pages, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardServer]:
    if _MISSING is not None:
        pytest.skip(_MISSING)
    srv = DashboardServer(pages.url, tmp_path_factory.mktemp("logs") / "s.log", local_worker=False)
    yield srv
    srv.stop()


@pytest.mark.slow
@pytest.mark.skipif(_MISSING is not None, reason=f"browser tests skipped: {_MISSING}")
def test_series_page_in_chromium(server: DashboardServer, pages: Pages) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            con = Console(page)
            page.goto(server.url + "/series/web.series?metric=ttft:p99")
            (chart,) = assert_drawn(page, 1)
            assert chart["drawn"] >= 3  # runs, flagged, segment medians
            box: Any = page.evaluate(
                """() => { const p = document.querySelector(
                     '#plot-trend .scatterlayer .trace:first-child .points path');
                   const r = p.getBoundingClientRect();
                   return {x: r.x + r.width / 2, y: r.y + r.height / 2}; }"""
            )
            page.mouse.move(box["x"], box["y"])
            with page.expect_navigation():
                page.mouse.click(box["x"], box["y"])
            assert page.url == f"{server.url}/runs/{pages.ids[0]}"
            wait_js(page, "() => document.body.dataset.plotsDrawn === '1'")
            assert con.problems() == [], con.problems()
        finally:
            browser.close()
