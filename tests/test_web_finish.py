"""Issue 17, the finish (over HTTP, TestClient): static files under content-hashed URLs with
a year-long immutable cache, HTML error pages for browsers and JSON for the API, times in
``<time>`` markup, one rule of decimals per column, and a compare table with human labels
and units."""

from __future__ import annotations

import datetime as dt
import hashlib
import html
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.services.runs import open_database
from app.storage import repository as repo
from app.storage.db import session_scope
from app.web.context import fmt_dt, fmt_ms, fmt_num
from tests.web_support import Seeded, seed, web_app

STATIC = Path(__file__).resolve().parents[1] / "static"
HTML_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
STATIC_LINK = re.compile(r'(?:src|href)="(/static/[^"]+)"')


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Seeded:
    return seed(tmp_path_factory.mktemp("finish"))


@pytest.fixture(scope="module")
def client(seeded: Seeded) -> Iterator[TestClient]:
    with TestClient(web_app(seeded.url)) as c:
        yield c


def _sha12(name: str) -> str:
    return hashlib.sha256((STATIC / name).read_bytes()).hexdigest()[:12]


def _text(fragment: str) -> str:
    """What a reader sees of an HTML fragment: tags dropped, entities decoded, spaces
    collapsed."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", fragment))).strip()


# ------------------------------------------------------------------------ static files


def test_pages_link_static_files_by_content_hash(client: TestClient, seeded: Seeded) -> None:
    expected = {
        f"/static/style.{_sha12('style.css')}.css",
        f"/static/app.{_sha12('app.js')}.js",
        f"/static/plotly.min.{_sha12('plotly.min.js')}.js",
    }
    plotly = f"/static/plotly.min.{_sha12('plotly.min.js')}.js"
    assert set(STATIC_LINK.findall(client.get("/").text)) == expected - {plotly}
    for path in (f"/runs/{seeded.normal}", f"/compare?ids={seeded.normal}&ids={seeded.one}"):
        links = set(STATIC_LINK.findall(client.get(path).text))
        assert links == expected, (path, links)
    docs = client.get("/docs").text
    assert f'src="/static/swagger-init.{_sha12("swagger-init.js")}.js"' in docs


@pytest.mark.parametrize("name", ["plotly.min.js", "app.js", "style.css", "swagger-init.js"])
def test_hashed_url_is_immutable_plain_url_revalidates(client: TestClient, name: str) -> None:
    stem, ext = name.rsplit(".", 1)
    body = (STATIC / name).read_bytes()
    hashed = client.get(f"/static/{stem}.{_sha12(name)}.{ext}")
    assert hashed.status_code == 200 and hashed.content == body
    assert hashed.headers["cache-control"] == "public, max-age=31536000, immutable"
    plain = client.get(f"/static/{name}")
    assert plain.status_code == 200 and plain.content == body
    assert plain.headers["cache-control"] == "no-cache"
    again = client.get(f"/static/{name}", headers={"If-None-Match": plain.headers["etag"]})
    assert again.status_code == 304  # revalidated, not downloaded again


def test_wrong_or_unknown_static_paths_404(client: TestClient) -> None:
    good = _sha12("plotly.min.js")
    wrong = ("0" if good[0] != "0" else "1") + good[1:]
    for path in (
        f"/static/plotly.min.{wrong}.js",
        "/static/plotly.min.000000000000.js",
        "/static/nope.js",
        "/static/../pyproject.toml",
    ):
        assert client.get(path).status_code == 404, path


# ------------------------------------------------------------------------ error pages


def test_page_404_is_html_with_a_link_home_and_the_csp(client: TestClient) -> None:
    for path in ("/no-such-page", "/runs/nope", "/sweeps/nope"):
        r = client.get(path, headers={"Accept": HTML_ACCEPT})
        assert r.status_code == 404, path
        assert r.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in r.headers["content-security-policy"]
        assert 'id="error-page" data-status="404"' in r.text
        assert '<a href="/" id="error-home">' in r.text
        assert "<title>404 Not Found · tokentrace</title>" in r.text
    r = client.get("/sweeps/nope", headers={"Accept": HTML_ACCEPT})
    assert "no sweep with id &#39;nope&#39;" in r.text  # the reason, escaped


def test_api_and_json_clients_keep_json_errors(client: TestClient) -> None:
    api = client.get("/api/v1/runs/nope", headers={"Accept": HTML_ACCEPT})
    assert api.status_code == 404 and api.json() == {"detail": "no run with id 'nope'"}
    page = client.get("/no-such-page", headers={"Accept": "application/json"})
    assert page.status_code == 404 and page.json() == {"detail": "Not Found"}
    default = client.get("/no-such-page")  # httpx's Accept: */*
    assert default.status_code == 404 and default.json() == {"detail": "Not Found"}


def test_500_is_an_html_page_for_browsers_and_json_for_the_api(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'e.db'}"
    open_database(url)
    app = web_app(url)

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("a bug")

    @app.get("/api/v1/boom")
    def api_boom() -> None:
        raise RuntimeError("a bug")

    with TestClient(app, raise_server_exceptions=False) as c:
        page = c.get("/boom", headers={"Accept": HTML_ACCEPT})
        assert page.status_code == 500 and page.headers["content-type"].startswith("text/html")
        assert 'data-status="500"' in page.text and 'id="error-home"' in page.text
        assert "a bug" not in page.text  # the traceback stays in the log
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-content-type-options"] == "nosniff"
        api = c.get("/api/v1/boom", headers={"Accept": HTML_ACCEPT})
        assert api.status_code == 500
        assert api.json()["detail"].startswith("the server failed")


# ------------------------------------------------------------------------ times, numbers


def test_times_are_time_elements_in_utc() -> None:
    t = dt.datetime(2026, 3, 4, 5, 6, 7, 890, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert str(fmt_dt(t)) == (
        '<time datetime="2026-03-04T03:06:07Z" title="2026-03-04 03:06:07 UTC">'
        "2026-03-04 03:06:07 UTC</time>"
    )
    assert str(fmt_dt("2026-03-04T03:06:07+00:00")).startswith('<time datetime="2026-03-04T03')
    assert fmt_dt(None) == "—"


def test_run_page_and_runs_list_show_created_at_in_utc(client: TestClient, seeded: Seeded) -> None:
    with session_scope(seeded.sessions) as s:
        created = repo.get_run(s, seeded.normal).created_at.astimezone(dt.UTC)
    want = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    shown = created.strftime("%Y-%m-%d %H:%M:%S UTC")
    tag = f'<time datetime="{want}" title="{shown}">{shown}</time>'
    assert tag in client.get(f"/runs/{seeded.normal}").text
    assert tag in client.get("/").text


def test_decimals_are_one_rule_per_unit() -> None:
    assert [fmt_ms(v) for v in (0.5, 9.999, 12.3456, 1234.5678)] == [
        "0.50", "10.00", "12.35", "1,234.57",
    ]  # fmt: skip
    assert [fmt_num(v) for v in (3.0, 999.94, 12345.67)] == ["3.0", "999.9", "12,345.7"]
    assert fmt_ms(None) == "—" and fmt_num(float("nan")) == "—"


def test_latency_columns_have_the_same_decimals_in_every_cell(
    client: TestClient, seeded: Seeded
) -> None:
    page = client.get(f"/runs/{seeded.normal}").text
    table = page[page.index('id="pct-table"') : page.index("</table>", page.index("pct-table"))]
    cells = re.findall(r'<td class="num">([^<]*)<div class="ci">([^<]*)</div>', table)
    assert len(cells) >= 20
    for value, ci in cells:
        assert re.fullmatch(r"[\d,]+\.\d\d", value), value
        assert re.fullmatch(r"[\d,]+\.\d\d–[\d,]+\.\d\d", ci), ci
    runs = client.get("/").text
    body = runs[runs.index("<tbody", runs.index('id="runs-table"')) : runs.index("</tbody>")]
    columns: dict[int, list[tuple[str, str]]] = {}
    for row in re.findall(r"<tr.*?</tr>", body, re.S):
        cells = re.findall(r'<td class="num" data-value="([^"]*)">([^<]*)</td>', row)
        for i, (raw, shown) in enumerate(cells):
            if raw:
                columns.setdefault(i, []).append((raw, shown))
    assert len(columns) >= 4  # TTFT p50, p99, TPOT p50, tok/s (+ goodput, errors)
    for cells in columns.values():
        if cells[0][1].endswith("%"):  # error rate: 1 decimal of a percentage
            assert all(shown == f"{float(raw) * 100:.1f}%" for raw, shown in cells), cells
            continue
        decimals = {len(shown.split(".")[1]) for _, shown in cells}
        assert len(decimals) == 1 and decimals <= {1, 2}, cells  # one rule per column
        d = decimals.pop()
        assert all(shown == f"{float(raw):,.{d}f}" for raw, shown in cells), cells


# ------------------------------------------------------------------------ compare labels


def test_compare_table_has_labels_units_and_relative_or_absolute_changes(
    client: TestClient, seeded: Seeded
) -> None:
    page = client.get(f"/compare?ids={seeded.normal}&ids={seeded.one}").text
    start = page.index('id="compare-table"')
    table = page[start : page.index("</table>", start)]
    text = _text(table)
    for raw in ("output_throughput_tok_s", "request_throughput_req_s", "goodput_req_s",
                "ttft_ms", "e2el_ms", "itl_ms"):  # fmt: skip
        assert raw not in text, raw
    for heading in ("TTFT (ms)", "TPOT (ms)", "E2E latency (ms)", "Output throughput (tok/s)",
                    "Request throughput (req/s)", "Goodput (req/s)"):  # fmt: skip
        assert heading in text, heading
    # each latency change: a relative % and an absolute interval in ms
    cell = re.search(
        r'data-metric="ttft_ms" data-p="p50"><span class="cand">([^<]+)</span>\s*'
        r'<div class="small"><span class="rel"[^>]*>([^<]+)</span>\s*'
        r'<span class="muted abs"[^>]*>\[([^,]+), ([^\]]+)\]</span>',
        table,
    )
    assert cell is not None, table[:2000]
    cand, rel, lo, hi = cell.groups()
    assert re.fullmatch(r"[\d,]+\.\d\d ms", cand)
    assert re.fullmatch(r"[+-]\d+\.\d%", rel)
    assert re.fullmatch(r"[+-][\d,]+\.\d\d ms", lo) and re.fullmatch(r"[+-][\d,]+\.\d\d ms", hi)
    # the rates shown are the runs' own, with the metric's decimals and unit
    api = client.get(f"/api/v1/runs/{seeded.one}").json()
    tput = api["report"]["metrics"]["output_throughput_tok_s"]
    row = re.search(r'data-metric="output_throughput_tok_s">(.*?)</tr>', table, re.S)
    assert row is not None
    assert f"{tput:,.1f} tok/s" in _text(row.group(1))
