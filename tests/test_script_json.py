"""JSON embedded in ``<script type="application/json">`` escapes ``<``, ``>``, ``&``,
U+2028 and U+2029 (it escaped only ``</``), and user strings in Plotly figures (trace
names, titles, hover templates) are HTML-escaped: Plotly renders its text as a subset of
HTML, so a run named ``<a href="javascript:...">`` became a live link in the legend
(issue 14, item 13)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from app.figures.scriptjson import plot_text, plotly_json, script_json
from tests.api_support import Api, api_client, wire

HOSTILE = '</script><a href="javascript:alert(1)">pwn</a> & co\u2028<!--'
FIG_BLOCK = re.compile(
    r'<script type="application/json" id="fig-([a-z0-9_]+)">(.*?)</script>', re.S
)


def test_script_json_escapes_every_character_html_could_read() -> None:
    text = script_json({"s": HOSTILE, "n": [1, 2.5, None]})
    for ch in ("<", ">", "&", "\u2028", "\u2029"):
        assert ch not in text, ch
    assert json.loads(text) == {"s": HOSTILE, "n": [1, 2.5, None]}  # same data back
    with pytest.raises(ValueError):
        script_json({"x": float("nan")})  # still strict JSON


def test_plot_text_escapes_markup_but_keeps_plotly_line_breaks() -> None:
    assert plot_text('<a href="x">y</a> & <b>z</b><br>') == (
        '&lt;a href="x"&gt;y&lt;/a&gt; &amp; <b>z</b><br>'
    )
    assert plot_text("p50 <img src=x onerror=alert(1)>") == "p50 &lt;img src=x onerror=alert(1)&gt;"


def test_plotly_json_escapes_text_fields_only() -> None:
    fig = {
        "data": [
            {
                "name": HOSTILE,
                "x": [1],
                "y": [2],
                "text": ["<i>ok</i>", "<script>"],
                "hovertemplate": "%{x} ms<br>%{y}<extra></extra>",
                "customdata": [3],
            }
        ],
        "layout": {"title": {"text": f"{HOSTILE} vs baseline"}, "xaxis": {"title": {"text": "ms"}}},
    }
    out = json.loads(plotly_json(fig))
    trace = out["data"][0]
    assert trace["name"] == plot_text(HOSTILE) and "<a" not in trace["name"]
    assert trace["text"] == ["<i>ok</i>", "&lt;script&gt;"]
    assert trace["hovertemplate"] == "%{x} ms<br>%{y}<extra></extra>"  # the figure's own markup
    assert trace["x"] == [1] and trace["customdata"] == [3]
    assert out["layout"]["title"]["text"].startswith("&lt;/script&gt;&lt;a href=")
    assert fig["data"][0]["name"] == HOSTILE  # the caller's figure is not changed


# ------------------------------------------------------------------------- pages


@pytest.fixture
def api(sqlite_url: str) -> Iterator[Api]:
    with api_client(sqlite_url) as a:
        yield a


def _finished_run(api: Api, name: str) -> str:
    out = api.create_run(name=name)
    job = api.lease(api.register())
    assert job is not None
    body = {"lease_id": job["lease_id"], "batch_no": 0, "requests": wire(list(range(6)))}
    assert api.post_job(out["job_id"], "results", body).status_code == 200
    done = {"lease_id": job["lease_id"], "status": "succeeded", "total_batches": 1}
    assert api.post_job(out["job_id"], "complete", done).status_code == 200
    run_id: str = out["run_id"]
    return run_id


def test_compare_page_figures_carry_no_markup_from_run_names(api: Api) -> None:
    a = _finished_run(api, HOSTILE)
    b = _finished_run(api, HOSTILE + " 2")
    page = api.client.get("/compare", params={"ids": f"{a},{b}"})
    assert page.status_code == 200, page.text[:500]
    blocks = dict(FIG_BLOCK.findall(page.text))
    assert "cdf_ttft_ms" in blocks and "delta_0" in blocks
    for key, raw in blocks.items():
        assert "<" not in raw and ">" not in raw and "&" not in raw, key
    cdf = json.loads(blocks["cdf_ttft_ms"])
    names = [t.get("name") for t in cdf["data"]]
    assert plot_text(HOSTILE) in names and HOSTILE not in names
    for t in cdf["data"]:
        assert "<a " not in (t.get("hovertemplate") or "")
    delta = json.loads(blocks["delta_0"])
    assert "<a " not in json.dumps(delta["layout"]["title"])
    assert '<a href="javascript' not in page.text  # nowhere on the page, escaped or not
