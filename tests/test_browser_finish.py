"""Issue 17, the finish, in headless Chromium behind the app's strict CSP: times in the
viewer's local zone (UTC on hover, UTC without JavaScript), the HTML 404 page with its way
home, and plotly.js fetched once (a second visit draws the charts from the browser cache)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from zoneinfo import ZoneInfo

import pytest

from app.storage import repository as repo
from app.storage.db import session_scope
from tests.browser_support import CHROMIUM, Console, DashboardServer, assert_drawn, browser_missing
from tests.web_support import Seeded, seed

pytestmark = pytest.mark.slow
_MISSING = browser_missing()
if _MISSING:
    pytest.skip(f"browser tests skipped: {_MISSING}", allow_module_level=True)

from playwright.sync_api import Browser, sync_playwright  # noqa: E402

ZONE = "America/New_York"  # UTC-5 in winter, UTC-4 in summer: the zone name is checked


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Seeded:
    return seed(tmp_path_factory.mktemp("finish-browser"))


@pytest.fixture(scope="module")
def server(seeded: Seeded, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardServer]:
    srv = DashboardServer(seeded.url, tmp_path_factory.mktemp("logs") / "server.log")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser(server: DashboardServer) -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def _created(seeded: Seeded) -> dt.datetime:
    with session_scope(seeded.sessions) as s:
        return repo.get_run(s, seeded.normal).created_at.astimezone(dt.UTC)


def test_times_show_in_the_viewers_zone_with_utc_on_hover(
    browser: Browser, server: DashboardServer, seeded: Seeded
) -> None:
    created = _created(seeded)
    local = created.astimezone(ZoneInfo(ZONE))
    want = local.strftime("%Y-%m-%d %H:%M:%S ") + str(local.tzname())  # "… EST" / "… EDT"
    utc = created.strftime("%Y-%m-%d %H:%M:%S UTC")
    ctx = browser.new_context(timezone_id=ZONE, locale="en-US")
    page = ctx.new_page()
    con = Console(page)
    for path in (f"/runs/{seeded.normal}", "/"):
        page.goto(server.url + path)
        page.wait_for_load_state("load")
        stamp = page.locator(f'time[datetime="{created.strftime("%Y-%m-%dT%H:%M:%SZ")}"]')
        assert stamp.count() >= 1, path
        assert stamp.first.inner_text() == want, path
        assert stamp.first.get_attribute("title") == utc
    assert con.problems() == []
    ctx.close()


def test_times_say_utc_without_javascript(
    browser: Browser, server: DashboardServer, seeded: Seeded
) -> None:
    created = _created(seeded)
    ctx = browser.new_context(timezone_id=ZONE, java_script_enabled=False)
    page = ctx.new_page()
    page.goto(server.url + f"/runs/{seeded.normal}")
    stamp = page.locator(f'time[datetime="{created.strftime("%Y-%m-%dT%H:%M:%SZ")}"]').first
    assert stamp.inner_text() == created.strftime("%Y-%m-%d %H:%M:%S UTC")
    ctx.close()


def test_404_page_in_the_browser_links_home(browser: Browser, server: DashboardServer) -> None:
    ctx = browser.new_context()
    page = ctx.new_page()
    con = Console(page)
    resp = page.goto(server.url + "/runs/no-such-run")
    assert resp is not None and resp.status == 404
    assert resp.headers["content-type"].startswith("text/html")
    assert page.locator("#error-page h1").inner_text().startswith("404")
    assert "no-such-run" in page.locator("#error-detail").inner_text()
    with page.expect_navigation():
        page.click("#error-home")
    assert page.url == server.url + "/"
    assert page.locator("#runs-table").count() == 1
    # Chromium logs the 404 document itself as a failed resource: nothing else
    assert [e for e in con.problems() if "status of 404" not in e] == []
    ctx.close()


RESOURCE_JS = """(part) => performance.getEntriesByType('resource')
  .filter((e) => e.name.includes(part))
  .map((e) => ({name: e.name, transferSize: e.transferSize, decodedBodySize: e.decodedBodySize}))"""


def test_second_visit_draws_the_run_page_with_plotly_from_the_cache(
    browser: Browser, server: DashboardServer, seeded: Seeded
) -> None:
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    con = Console(page)
    fetched: list[str] = []  # plotly responses that came over the network
    page.on(
        "requestfinished",
        lambda req: fetched.append(req.url) if "/static/plotly.min." in req.url else None,
    )
    url = server.url + f"/runs/{seeded.normal}"
    page.goto(url)
    assert_drawn(page)
    first = page.evaluate(RESOURCE_JS, "/static/plotly.min.")
    assert len(first) == 1 and first[0]["transferSize"] > 1_000_000, first  # downloaded once
    assert len(fetched) == 1
    page.goto(server.url + "/")  # elsewhere, then back by a link, as a reader does
    page.goto(url)
    assert_drawn(page)
    second = page.evaluate(RESOURCE_JS, "/static/plotly.min.")
    assert len(second) == 1 and second[0]["name"] == first[0]["name"]
    assert second[0]["transferSize"] == 0, second  # from the cache: no bytes over the wire
    assert second[0]["decodedBodySize"] == first[0]["decodedBodySize"]
    assert con.problems() == []
    ctx.close()
