"""Issue 24 items 11-12 in headless Chromium, as a user does them (clicks, typing, keys):
manage a sweep from its page (tags, note, baseline, delete); set goodput SLOs there;
compare a run with a saved baseline from its page and from one ticked run; pick the
Roofline run and the throughput-vs-batch runs; download the JSON-lines exports; reach the
API docs; the skip link and the runs-list sort by keyboard; the requests pager's numbers,
last and jump; wide tables scrolling inside their box at 1440 and 900 px; a long target
URL broken only between its parts. One server and one browser for the module; every page
keeps a clean console (no error, no CSP violation)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from app.client.spec import RunSpec
from app.services import auth
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from tests.browser_finish_support import LONG_HOST, N_BIG, Lab, make_lab
from tests.browser_support import (
    CHROMIUM,
    Console,
    DashboardServer,
    assert_drawn,
    browser_missing,
    sign_in,
    submit_refused,
    wait_js,
)

pytestmark = pytest.mark.slow
_MISSING = browser_missing()
if _MISSING:
    pytest.skip(f"browser tests skipped: {_MISSING}", allow_module_level=True)

from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright  # noqa: E402


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    return make_lab(tmp_path_factory.mktemp("finish-browser"))


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


@pytest.fixture(scope="module")
def contexts(
    browser: Browser, server: DashboardServer, lab: Lab
) -> Iterator[dict[int, BrowserContext]]:
    """One browser context per viewport width for the module (its cache and its sign-in,
    with a token that has the ``run`` scope, are shared by the tests' pages)."""
    with session_scope(lab.sessions) as s:
        _, secret = auth.create_token(s, scopes=["run"], name="finish-browser")
    out = {}
    for width in (1440, 900):
        ctx = browser.new_context(viewport={"width": width, "height": 1000}, accept_downloads=True)
        sign_in(ctx.new_page(), server, secret, "/")
        out[width] = ctx
    yield out
    for ctx in out.values():
        ctx.close()


def _page(contexts: dict[int, BrowserContext], width: int = 1440) -> Page:
    return contexts[width].new_page()


@pytest.fixture
def page(contexts: dict[int, BrowserContext]) -> Iterator[Page]:
    pg = _page(contexts)
    yield pg
    pg.close()


def _submit(page: Page, selector: str) -> None:
    with page.expect_navigation():
        page.click(selector)


def _press(page: Page, selector: str, key: str) -> None:
    with page.expect_navigation():
        page.press(selector, key)


# ------------------------------------------------------------------ item 11: sweeps


def test_manage_a_sweep_from_its_page(page: Page, server: DashboardServer, lab: Lab) -> None:
    con = Console(page)
    with session_scope(lab.sessions) as s:
        sweep_id = compare_repo.create_sweep(
            s, spec={"model": "m"}, mode="concurrencies", loads=[1.0], name="to manage",
            status="succeeded",
        )  # fmt: skip
        run_id = repo.create_run(
            s, RunSpec(base_url="http://127.0.0.1:9", model="m", num_prompts=1), name="its step"
        )
        compare_repo.add_step(
            s, sweep_id, step_idx=0, run_id=run_id, load=1.0, load_kind="concurrency"
        )
    page.goto(f"{server.url}/sweeps/{sweep_id}")
    # a tag too long: named beside the field (422), nothing saved
    page.fill("#f-tags", "fine, " + "y" * 120)
    submit_refused(page, con, "#tags-save")
    assert page.locator("#err-tags").inner_text().startswith("tags:")
    page.fill("#f-tags", "")
    page.type("#f-tags", "h200, nightly")
    _press(page, "#f-tags", "Enter")
    assert page.locator("#flash").inner_text() == "Tags saved."
    assert page.locator("h1 .tag").all_inner_texts() == ["h200", "nightly"]
    page.fill("#f-note", "after the driver update")
    _submit(page, "#note-save")
    assert page.locator("#sweep-note").inner_text() == "after the driver update"
    page.fill("#f-baseline_name", "sweep-gate")
    page.check("#f-pin")
    _submit(page, "#baseline-save")
    assert page.locator("#flash").inner_text() == "Baseline saved."
    assert "pinned" in page.locator("#baselines-table tr[data-baseline='sweep-gate']").inner_text()
    # follow the tag to the sweeps list, filtered, and back by the sweep's link
    _submit(page, "h1 a.tag:has-text('nightly')")
    assert page.locator("#sweeps-table tbody tr").count() == 1
    _submit(page, f"#sweeps-table a[href='/sweeps/{sweep_id}']")
    # delete: the confirmation says what goes, the word must be typed
    _submit(page, "#delete-sweep")
    assert page.locator("#delete-runs").inner_text() == "1"
    page.type("#f-confirm", "delete")
    _submit(page, "#delete-submit")
    assert page.url.endswith(f"/sweeps?deleted={sweep_id}")
    assert page.locator("#flash").inner_text() == f"Sweep {sweep_id} deleted."
    assert page.locator(f"tr[data-sweep-id='{sweep_id}']").count() == 0
    with session_scope(lab.sessions) as s:
        assert compare_repo.find_sweep(s, sweep_id) is None
        assert repo.find_run(s, run_id) is None
        b = compare_repo.current_baseline(s, "sweep-gate")
        assert b is not None and b.sweep_id is None  # kept, pointing at nothing
    assert con.problems() == []


def test_goodput_slos_set_on_the_sweep_page(page: Page, server: DashboardServer, lab: Lab) -> None:
    con = Console(page)
    page.goto(f"{server.url}/sweeps/{lab.sweep_id}")
    text = page.locator("#max-goodput").inner_text()
    assert "no SLO set" in text and "--" not in text
    _submit(page, "#set-slos")  # an in-page link: to the form
    page.fill("#slo_ttft", "")
    page.type("#slo_ttft", "100000")
    _press(page, "#slo_ttft", "Enter")
    assert "slo_ttft=100000" in page.url
    # every step meets a 100 s TTFT: the highest load is the sweep's last, concurrency 4
    assert "concurrency 4" in page.locator("#max-goodput").inner_text()
    assert page.locator("#slo_ttft").input_value() == "100000"
    assert_drawn(page)
    assert con.problems() == []


# ------------------------------------------------- item 11: compare with a baseline


def test_compare_a_run_with_a_saved_baseline(page: Page, server: DashboardServer, lab: Lab) -> None:
    con = Console(page)
    page.goto(f"{server.url}/runs/{lab.step_runs[2]}")
    page.select_option("#f-compare-baseline", lab.baseline)
    _submit(page, "#compare-baseline-submit")
    assert page.locator("#compare-table").count() == 1
    heading = page.locator("#compare-heading").inner_text()
    assert heading.startswith("c1 (baseline) vs c4") and "saved baseline" in heading
    # from the runs list: one ticked run, then the baseline picked on the next page
    page.goto(server.url + "/")
    assert page.locator("#compare-btn").is_disabled()
    page.check(f"input.pick[value='{lab.turns_run}']")
    assert page.locator("#compare-btn").is_enabled()
    assert "saved baseline" in page.locator("#compare-count").inner_text()
    _submit(page, "#compare-btn")
    assert page.locator("#pick-baseline").count() == 1
    page.select_option("#f-compare-baseline", lab.baseline)
    _submit(page, "#compare-baseline-submit")
    assert page.locator("#compare-table").count() == 1
    assert page.locator("#compare-heading").inner_text().startswith("c1 (baseline) vs multi-turn")
    assert_drawn(page)
    assert con.problems() == []


# ------------------------------------------------------ item 11: Roofline, scaling


def test_roofline_run_and_scaling_runs_are_picked(
    page: Page, server: DashboardServer, lab: Lab
) -> None:
    con = Console(page)
    page.goto(server.url + "/roofline")
    page.select_option("#f-run", lab.step_runs[1])
    page.select_option("#f-model", "llama-3-8b")
    _submit(page, "#roofline-submit")
    rows = page.locator("#ops-table tbody tr")
    assert rows.count() == 2 and "decode" in rows.nth(0).inner_text()
    assert all(r.startswith("c2") for r in rows.all_inner_texts())
    assert_drawn(page)
    # throughput vs batch: the concurrency sweep from its picker
    page.goto(server.url + "/throughput")
    assert page.locator("#empty-scaling").count() == 1
    page.select_option("#f-sweep", lab.sweep_id)
    _submit(page, "#scaling-submit")
    found = {c["id"]: c for c in assert_drawn(page)}
    xs = page.evaluate(
        "() => document.getElementById('plot-throughput').data.flatMap((t) => t.x || [])"
    )
    assert sorted(xs) == [1, 2, 4] and found["plot-throughput"]["points"] > 0
    # or runs one by one, ticked with the keyboard
    page.goto(server.url + "/throughput")
    for rid in lab.step_runs[:2]:
        page.focus(f"input[name='run'][value='{rid}']")
        page.keyboard.press("Space")
    _submit(page, "#scaling-submit")
    xs = page.evaluate(
        "() => document.getElementById('plot-throughput').data.flatMap((t) => t.x || [])"
    )
    assert sorted(xs) == [1, 2]
    assert con.problems() == []


# --------------------------------------------------- item 11: exports and API docs


def test_json_lines_downloads_and_the_api_docs_link(
    page: Page, server: DashboardServer, lab: Lab
) -> None:
    con = Console(page)
    page.goto(f"{server.url}/runs/{lab.turns_run}")
    header = page.locator("#run-header").inner_text()
    n_requests = int(header.split(" requests")[0].rsplit("· ", 1)[-1].replace(",", ""))
    n_events = int(header.split(" events")[0].rsplit(", ", 1)[-1].replace(",", ""))
    for link, expected in (("#dl-requests-jsonl", n_requests), ("#dl-events-jsonl", n_events)):
        with page.expect_download() as dl:
            page.click(link)
        with open(dl.value.path()) as f:
            lines = [json.loads(x) for x in f.read().splitlines() if x]
        assert len(lines) == expected, link
    _submit(page, "#nav-api-docs")
    assert page.url.endswith("/docs")
    wait_js(page, "() => document.querySelectorAll('#swagger-ui .opblock').length > 10")
    assert con.problems() == []


# ------------------------------------------------------ item 12: keyboard, tables

SORTED_JS = """(col) => Array.from(document.querySelectorAll('#runs-table tbody tr'))
  .map((r) => r.cells[col].dataset.value)"""


def test_skip_link_and_runs_sort_by_keyboard(page: Page, server: DashboardServer, lab: Lab) -> None:
    con = Console(page)
    page.goto(server.url + "/")
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.id") == "skip-link"
    page.keyboard.press("Enter")
    assert page.evaluate("() => document.activeElement.id") == "main"
    assert page.url.endswith("#main")
    th = page.locator("#runs-table th:has(button:text-is('TTFT p50 (ms)'))")
    col = th.evaluate("(th) => Array.prototype.indexOf.call(th.parentNode.children, th)")
    assert page.locator("#runs-table th[aria-sort]").count() == 0
    th.locator("button").focus()
    page.keyboard.press("Enter")
    assert th.get_attribute("aria-sort") == "ascending"
    values = [float(v) for v in page.evaluate(SORTED_JS, col) if v]
    assert len(values) >= 2 and values == sorted(values)
    page.keyboard.press("Space")
    assert th.get_attribute("aria-sort") == "descending"
    values = [float(v) for v in page.evaluate(SORTED_JS, col) if v]
    assert values == sorted(values, reverse=True)
    assert page.locator("#runs-table th[aria-sort]").count() == 1
    assert con.problems() == []


def test_requests_pager_numbers_last_and_jump(
    page: Page, server: DashboardServer, lab: Lab
) -> None:
    con = Console(page)
    page.goto(f"{server.url}/runs/{lab.big_run}/requests")
    count = page.locator("#requests-count")
    assert count.inner_text().startswith(f"1–100 of {N_BIG:,}")
    _submit(page, "#requests-pager a[data-page='3']")
    assert count.inner_text().startswith("201–300")
    assert page.locator("#requests-table tbody tr").first.get_attribute("data-idx") == "200"
    _submit(page, "#requests-last")
    assert count.inner_text().startswith(f"2,901–3,000 of {N_BIG:,}")
    assert page.locator("#requests-pager [aria-current='page']").inner_text() == "30"
    page.fill("#f-page", "")
    page.type("#f-page", "17")
    _press(page, "#f-page", "Enter")
    assert "page=17" in page.url and count.inner_text().startswith("1,601–1,700")
    assert page.locator("#requests-table tbody tr").first.get_attribute("data-idx") == "1600"
    _submit(page, "#requests-first")
    assert count.inner_text().startswith("1–100")
    assert con.problems() == []


BOXES_JS = """() => ({
  page: document.documentElement.scrollWidth - window.innerWidth,
  boxes: Array.from(document.querySelectorAll('.scroll')).map((box) => {
    const t = box.querySelector('table');
    const heads = t.tHead.rows[t.tHead.rows.length - 1].cells;
    const clipped = Array.from(t.querySelectorAll('th, td'))
      .filter((c) => c.scrollWidth > c.clientWidth + 1).map((c) => c.textContent.trim());
    return {id: t.id, over: box.scrollWidth - box.clientWidth, tab: box.tabIndex,
            role: box.getAttribute('role'), label: box.getAttribute('aria-label'),
            overflowX: getComputedStyle(box).overflowX, clipped: clipped,
            last: heads[heads.length - 1].textContent.trim()};
  }),
})"""

LAST_VISIBLE_JS = """(id) => {
  const t = document.getElementById(id), box = t.closest('.scroll');
  const heads = t.tHead.rows[t.tHead.rows.length - 1].cells;
  const c = heads[heads.length - 1].getBoundingClientRect(), b = box.getBoundingClientRect();
  return c.right <= b.right + 1 && c.left >= b.left - 1;
}"""


@pytest.mark.parametrize("width", [1440, 900])
def test_wide_tables_scroll_inside_their_box(
    contexts: dict[int, BrowserContext], server: DashboardServer, lab: Lab, width: int
) -> None:
    page = _page(contexts, width)
    con = Console(page)
    try:
        pages = {
            f"/runs/{lab.turns_run}": {"pct-table", "turn-table"},
            f"/runs/{lab.big_run}/requests": {"requests-table"},
            "/": {"runs-table"},
        }
        seen_scrolling = False
        for path, tables in pages.items():
            page.goto(server.url + path)
            found = page.evaluate(BOXES_JS)
            assert found["page"] <= 0, (path, found)  # nothing runs past the page
            boxes = {b["id"]: b for b in found["boxes"]}
            assert tables <= set(boxes), (path, boxes)
            for tid in tables:
                b = boxes[tid]
                assert b["overflowX"] == "auto" and b["clipped"] == [], (width, b)
                if b["over"] <= 0:
                    assert page.evaluate(LAST_VISIBLE_JS, tid), (width, b)
                    continue
                # wider than its box: focusable, named, scrolled by the arrow keys until
                # its last column is in view
                seen_scrolling = True
                assert b["tab"] == 0 and b["role"] == "region" and "scrolls" in b["label"], b
                assert not page.evaluate(LAST_VISIBLE_JS, tid)
                box = page.locator(f".scroll:has(#{tid})")
                box.focus()
                for _ in range(60):
                    page.keyboard.press("ArrowRight")
                    if page.evaluate(LAST_VISIBLE_JS, tid):
                        break
                assert page.evaluate(LAST_VISIBLE_JS, tid), (width, b)
        # the turn and percentile tables fit at 1440 and 900 once their headers wrap; the
        # runs list scrolls at 900
        assert seen_scrolling == (width == 900)
        assert con.problems() == []
    finally:
        page.close()


URL_CHARS_JS = """(sel) => {
  const cell = document.querySelector(sel), out = [];
  const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    for (let i = 0; i < n.length; i++) {
      const r = document.createRange(); r.setStart(n, i); r.setEnd(n, i + 1);
      const box = r.getClientRects()[0];
      out.push([n.data[i], box ? Math.round(box.top) : null]);
    }
  }
  return out;
}"""


def _lines(page: Page, selector: str) -> list[str]:
    """The cell's text as Chromium laid it out, line by line."""
    lines: list[str] = []
    top = None
    for ch, y in page.evaluate(URL_CHARS_JS, selector):
        if y != top or not lines:
            lines.append("")
            top = y
        lines[-1] += ch
    return lines


def _bad_breaks(url: str, lines: list[str], dns_host: str | None) -> list[str]:
    """Line breaks that are not between a URL's parts: allowed after ``//``, before a path
    ``/`` or ``?``, and after a dot of a DNS host name (never of an IP address)."""
    bad, at = [], 0
    for line in lines[:-1]:
        at += len(line)
        before, after = url[at - 1], url[at]
        in_host = dns_host is not None and url.find(dns_host) <= at < url.find(dns_host) + len(
            dns_host
        )
        if before == "/" or after in "/?" or (before == "." and in_host):
            continue
        bad.append(f"{url[:at]} | {url[at:]}")
    return bad


@pytest.mark.parametrize("width", [1440, 900])
def test_target_url_breaks_between_parts(
    contexts: dict[int, BrowserContext], server: DashboardServer, lab: Lab, width: int
) -> None:
    page = _page(contexts, width)
    try:
        page.goto(server.url + "/")
        url = f"https://{LONG_HOST}:8443/v1"
        long = _lines(page, f"tr[data-run-id='{lab.long_target}'] td.target")
        assert "".join(long) == url  # every character, in order
        assert len(long) > 1  # it does wrap in the narrow column ...
        assert _bad_breaks(url, long, LONG_HOST) == [], long  # ... between its parts only
        assert (
            page.locator(f"tr[data-run-id='{lab.long_target}'] td.target [title]").get_attribute(
                "title"
            )
            == url
        )
        ip = _lines(page, f"tr[data-run-id='{lab.turns_run}'] td.target")
        ip_url = "".join(ip)
        assert ip_url.startswith("http://127.0.0.1:")
        assert _bad_breaks(ip_url, ip, None) == [], ip  # 127.0.0.1:PORT never split
    finally:
        page.close()
