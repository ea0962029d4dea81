"""Issue 24.8: a probe whose repeated measurements disagree (spread (p90 - p10) / median over
25%) is flagged as untrustworthy on its page, in the probe list and on the roofline that
takes its ceilings. Spreads are computed by hand in ``tests/probe_spread_support.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.analysis.probe_spread import SPREAD_LIMIT, noisy_ceilings, spread_verdict
from app.figures.probes import roofline_figure
from tests.api_support import Api, api_client
from tests.probe_spread_support import NOISY_SPREAD, ceilings_result, store_probe


def test_the_rule_by_hand() -> None:
    assert SPREAD_LIMIT == 0.25
    noisy = ceilings_result(noisy=True)
    assert noisy["bandwidth"][0]["spread"] == pytest.approx(NOISY_SPREAD)  # 485%
    v = spread_verdict(noisy)
    assert v is not None
    assert [(n["section"], n["label"]) for n in v["noisy"]] == [("bandwidth", "copy 256 MiB")]
    assert v["worst"] == pytest.approx(4.85) and v["total"] == 4
    assert v["ceilings"] == ["bandwidth"]  # the best median copy is the noisy one
    assert "1 of 4 measurements" in v["message"] and "485%" in v["message"]
    assert spread_verdict(ceilings_result(noisy=False)) is None
    # the limit itself is not noisy; just over it is
    row = {"size_bytes": 2**20, "median_bps": 1.0, "spread": 0.25}
    assert spread_verdict({"bandwidth": [row]}) is None
    assert spread_verdict({"bandwidth": [row | {"spread": 0.2501}]}) is not None
    # a linear probe's shapes and sweep; a noisy row that sets no ceiling is not a ceiling
    lin = {"shapes": {"decode": {"spread": 0.9}}, "sweep": [{"m": 8, "spread": 0.01}]}
    assert [n["label"] for n in spread_verdict(lin)["noisy"]] == ["decode"]  # type: ignore[index]
    slow_noisy = ceilings_result(noisy=False)
    slow_noisy["bandwidth"][1]["spread"] = 0.5  # the 1 GiB copy: not the best median
    assert noisy_ceilings(slow_noisy) == []
    assert spread_verdict(None) is None and spread_verdict({"rows": [{"batch": 1}]}) is None


def test_roofline_figure_marks_a_noisy_roof() -> None:
    measured = {
        "probe_id": "p1",
        "label": "H200",
        "ceilings": ceilings_result(noisy=True)["ceilings"],
        "spread": spread_verdict(ceilings_result(noisy=True)),
    }
    fig = roofline_figure(measured, [], [], [])
    names = [t["name"] for t in fig["data"]]
    assert names == ["measured bf16 (H200) (noisy)", "measured fp32 (H200) (noisy)"]
    assert all(t["line"]["dash"] == "dashdot" for t in fig["data"])
    point = {"label": "decode", "m": 8, "k": 64, "n": 64, "dtype": "bf16", "median_ms": 1.0,
             "flops_s": 1e12, "bytes_s": 1e9, "intensity": 8.0, "spread": 0.9,
             "noisy": True}  # fmt: skip
    fig = roofline_figure(None, [], [point, point | {"noisy": False, "spread": 0.01}], [])
    assert [t["name"] for t in fig["data"]] == ["linear probe", "linear probe (noisy)"]
    assert "spread 90%" in fig["data"][1]["text"][0]


@pytest.fixture
def api(db_url: str) -> Iterator[Api]:
    with api_client(db_url) as a:
        yield a


def test_pages_flag_a_noisy_probe(api: Api) -> None:
    noisy = store_probe(api.sessions, ceilings_result(noisy=True), name="busy", device="GPU-N")
    steady = store_probe(api.sessions, ceilings_result(noisy=False), name="idle", device="GPU-S")
    page = api.client.get(f"/probes/{noisy}").text
    assert 'id="spread-warning"' in page and "485%" in page and "copy 256 MiB" in page
    assert 'class="num noisy"' in page
    clean = api.client.get(f"/probes/{steady}").text
    assert 'id="spread-warning"' not in clean and 'class="num noisy"' not in clean
    listing = api.client.get("/probes").text
    assert listing.count('class="tag noisy"') == 1 and "noisy: spread 485.0%" in listing
    roof = api.client.get("/roofline?device=GPU-N").text
    assert 'id="ceilings-noisy"' in roof and noisy in roof
    assert 'id="ceilings-noisy"' not in api.client.get("/roofline?device=GPU-S").text
    # the API gives the verdict too
    view = api.client.get(f"/api/v1/probes/{noisy}").json()
    assert view["spread"]["worst"] == pytest.approx(4.85)
