"""Figure builders: right traces, right point counts, downsampling said on the plot."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from app.domain import EventKind, RequestRecord, RequestStatus, trace_from_records
from app.figures import common as fg
from app.figures.phases import phase_breakdown_figure
from app.figures.runs import itl_by_position, run_figures


def _notes(fig: dict) -> list[str]:
    return [a["text"] for a in fig["layout"].get("annotations", [])]


def test_cdf_keeps_small_samples_and_downsamples_large_ones() -> None:
    small = fg.cdf_figure([3.0, 1.0, 2.0, np.nan], title="t")
    (tr,) = small["data"]
    assert tr["x"] == [1.0, 2.0, 3.0]
    assert tr["y"][-1] == 1.0
    assert not any("downsampled" in n for n in _notes(small))
    big = fg.cdf_figure(np.arange(100_000, dtype=float), title="t", max_points=500)
    (tr,) = big["data"]
    assert len(tr["x"]) == 500
    assert tr["x"][0] == 0.0 and tr["x"][-1] == 99_999.0  # extremes kept
    assert "downsampled: 500 of 100,000 points" in _notes(big)


def test_empty_inputs_give_a_no_data_figure() -> None:
    fig = fg.cdf_figure([np.nan], title="TTFT", no_data_reason="no successful request")
    assert fig["data"] == []
    assert _notes(fig) == ["no data: no successful request"]
    assert fg.histogram_figure([], title="h")["data"] == []
    assert fg.timeline_figure([], [], [], [], [], [])["data"] == []
    assert fg.itl_position_figure([], [])["data"] == []


def test_histogram_is_binned_server_side() -> None:
    fig = fg.histogram_figure(np.random.default_rng(0).normal(50, 5, 10_000), title="h", bins=40)
    body, tails = fig["data"]
    assert body["type"] == "bar" and len(body["x"]) == 40
    assert sum(body["y"]) + sum(tails["y"]) == 10_000  # no sample dropped
    assert 0 < sum(tails["y"]) <= 102  # about 1% beyond p0.5-p99.5
    assert "10,000 samples in 40 bins" in _notes(fig)[0]
    one = fg.histogram_figure([7.0], title="h")  # a single value still draws
    assert sum(one["data"][0]["y"]) == 1


def test_histogram_bins_come_from_the_data_not_its_outliers() -> None:
    """ITL-like data: most gaps near 1.5 ms, a few stalls of 390 ms. Linear bins over the
    whole range put the body in one bar; the quantile range keeps it readable."""
    rng = np.random.default_rng(3)
    itl = np.concatenate([rng.gamma(4.0, 0.4, 20_000), [390.0, 350.0, 300.0] * 20])
    edges, under, over = fg.histogram_bins(itl)
    p99 = float(np.percentile(itl, 99))
    assert edges[0] <= float(np.percentile(itl, 1)) and edges[-1] >= p99  # edges cover p99
    assert edges[-1] < 20  # ... but not the 390 ms stalls
    assert over == int(np.count_nonzero(itl > edges[-1])) >= 60 and under >= 1
    assert 10 <= len(edges) - 1 <= fg.HIST_BINS
    fig = fg.histogram_figure(itl, title="ITL", xtitle="ITL (ms)")
    body, tails = fig["data"]
    assert sum(body["y"]) + sum(tails["y"]) == itl.shape[0]
    assert max(body["y"]) < 0.5 * itl.shape[0]  # the body is spread over several bins
    assert any("max 390" in t for t in tails["text"])  # the stalls are named, not clipped
    y = fig["layout"]["yaxis"]
    assert y["tickformat"] == ",d" and y["dtick"] >= 1 and float(y["dtick"]).is_integer()


def test_counts_get_integer_ticks() -> None:
    assert fg.int_axis(3)["dtick"] == 1
    assert fg.int_axis(7)["dtick"] == 2
    assert fg.int_axis(230)["dtick"] == 50
    fig = fg.throughput_figure(
        np.linspace(0, 2, 50), np.ones(50), np.array([0.0, 0.5, 1.0]), np.array([2.0, 1.5, 1.8])
    )
    y2 = fig["layout"]["yaxis2"]
    assert y2["tickformat"] == ",d" and y2["dtick"] == 1 and y2["tick0"] == 0


def test_minmax_downsampling_keeps_spikes() -> None:
    y = np.ones(100_000)
    y[12_345] = 500.0  # one spike
    y[77_777] = -3.0  # one dip
    keep = fg.minmax_keep(y, 400)
    assert len(keep) <= 400 and 12_345 in keep and 77_777 in keep
    assert keep[0] == 0 and keep[-1] == 99_999
    fig = fg.scatter_figure(
        np.arange(100_000.0), y, title="t", xtitle="x (s)", ytitle="y (ms)", max_points=400
    )
    assert max(fig["data"][0]["y"]) == 500.0 and min(fig["data"][0]["y"]) == -3.0
    pos = np.tile(np.arange(1.0, 101.0), 1000)
    itl = np.full(pos.shape[0], 2.0)
    itl[54_321] = 390.0
    f2 = fg.itl_position_figure(pos, itl, max_points=500)
    assert 390.0 in f2["data"][0]["y"]


def test_timeline_one_bar_per_request_coloured_by_status() -> None:
    sent = np.array([0.0, 0.1, 0.2, np.nan])
    first = np.array([0.05, np.nan, 0.25, np.nan])
    last = np.array([0.5, np.nan, 0.6, np.nan])
    end = np.array([0.5, 0.15, 0.6, np.nan])
    fig = fg.timeline_figure(sent, first, last, end, ["ok", "error", "ok", "error"], [0, 1, 2, 3])
    names = [t["name"] for t in fig["data"]]
    assert names == ["waiting for first token", "error", "ok"]
    ok = fig["data"][2]
    assert len(ok["x"]) == 6  # two requests, 3 points each (start, stop, gap)
    assert ok["x"][:2] == [0.05, 0.5] and ok["x"][2] is None
    assert ok["customdata"][:3] == [0, 0, 0]
    err = fig["data"][1]
    assert err["x"][:2] == [0.1, 0.15]  # no token: sent -> end
    many = fg.timeline_figure(
        np.arange(5000.0),
        np.arange(5000.0) + 1,
        np.arange(5000.0) + 2,
        np.arange(5000.0) + 2,
        ["ok"] * 5000,
        np.arange(5000),
        max_bars=100,
    )
    assert len(many["data"][1]["x"]) == 300
    assert "downsampled: 100 of 5,000 requests" in _notes(many)


def test_in_flight_steps_exact_and_peak_preserving() -> None:
    x, y, total = fg.in_flight_steps(np.array([0.0, 1.0, 2.0]), np.array([3.0, 1.5, np.nan]), 4.0)
    assert total == 6
    assert x.tolist() == [0.0, 1.0, 1.5, 2.0, 3.0, 4.0]
    assert y.tolist() == [1, 2, 1, 2, 1, 0]
    rng = np.random.default_rng(1)
    sent = np.sort(rng.uniform(0, 100, 20_000))
    end = sent + rng.uniform(0.1, 5, 20_000)
    x2, y2, total2 = fg.in_flight_steps(sent, end, 200.0, max_points=400)
    _, exact, _ = fg.in_flight_steps(sent, end, 200.0, max_points=10**9)
    assert total2 == 40_000 and len(x2) <= 200
    assert y2.max() == exact.max()  # the peak survives downsampling


def test_throughput_figure_has_both_axes() -> None:
    t = np.linspace(0, 10, 1000)
    fig = fg.throughput_figure(t, np.ones(1000), np.array([0.0, 1.0]), np.array([10.0, 9.0]))
    assert [tr["name"] for tr in fig["data"]] == ["output tok/s", "in flight"]
    assert fig["data"][1]["yaxis"] == "y2"
    rate = np.array(fig["data"][0]["y"], dtype=float)
    assert rate.mean() == pytest.approx(100, rel=0.05)  # 1000 tokens over 10 s


def test_scatter_figures_downsample_with_a_note() -> None:
    fig = fg.scatter_figure(
        np.arange(10_000.0), np.ones(10_000), title="t", xtitle="x (s)", ytitle="y (ms)",
        max_points=1000,
    )  # fmt: skip
    assert 990 <= fg.point_count(fig) <= 1000
    assert f"downsampled: {fg.point_count(fig):,} of 10,000 points" in _notes(fig)
    fig2 = fg.ttft_input_figure(np.array([10, -1, 30]), np.array([1.0, 2.0, np.nan]))
    assert fig2["data"][0]["x"] == [10.0]  # unknown input length and NaN TTFT dropped


def test_request_events_figure_by_kind() -> None:
    fig = fg.request_events_figure([0.0, 5.0, 6.0, 7.0], [2, 1, 0, 0], [0, 1, 2, 1])
    names = [t["name"] for t in fig["data"]]
    assert names == ["tokens so far", "content", "reasoning", "role"]
    content = fig["data"][1]
    assert content["y"] == [3, 4] and content["customdata"] == [2, 1]
    assert fig["layout"]["yaxis"]["tickformat"] == ",d"  # token counts: whole ticks


def _record(
    i: int, sent: int, times: list[int], tokens: list[int], ok: bool = True
) -> RequestRecord:
    return RequestRecord(
        index=i,
        scheduled_ns=sent,
        sent_ns=sent,
        end_ns=(times[-1] if times else sent) + 1,
        status=RequestStatus.OK if ok else RequestStatus.ERROR,
        error=None if ok else "boom",
        input_tokens=10 * (i + 1),
        output_tokens=sum(tokens),
        event_t_ns=np.array(times, np.int64),
        event_bytes=np.ones(len(times), np.int32),
        event_kind=np.full(len(times), EventKind.CONTENT, np.int8),
        event_tokens=np.array(tokens, np.int32),
    )


def test_itl_by_position_per_token_gaps() -> None:
    recs = [
        _record(0, 0, [10, 20, 40], [1, 1, 2]),  # gaps 10 (pos 2), 20/2 (pos 4)
        _record(1, 5, [15, 25], [1, 1], ok=False),  # failed: excluded
        _record(2, 5, [100, 103], [2, 1]),  # gap 3 at position 3
    ]
    trace = trace_from_records(recs)
    pos, itl = itl_by_position(trace)  # sorted by position
    assert pos.tolist() == [2, 3, 4]
    assert itl.tolist() == pytest.approx([10e-6, 3e-6, 10e-6])


def test_run_figures_are_json_safe_and_complete() -> None:
    recs = [
        _record(i, i * 1000, [i * 1000 + 500 + k * 100 for k in range(5)], [1] * 5)
        for i in range(20)
    ]
    recs.append(_record(20, 30_000, [], [], ok=False))
    for r in recs:  # phases as a run with a new connection per request records them
        r.conn_id, r.conn_reused, r.connect_ns, r.queued_ns = r.index + 1, False, 200_000, 0
    plots = run_figures(trace_from_records(recs))
    keys = set(plots.figures)
    assert {"cdf_ttft", "hist_itl", "timeline", "throughput", "itl_position", "ttft_input"} <= keys
    assert "phases" in keys
    for key, fig in plots.figures.items():
        json.dumps(fig, allow_nan=False)  # no NaN reaches the browser
        if key not in ("send_lag", "queue_wait"):  # no schedule given
            assert fig["data"], key
    assert len(plots.figures["cdf_ttft"]["data"][0]["x"]) == 20


def test_phase_breakdown_stacks_each_requests_phases() -> None:
    """Two requests with hand-set phases (ns): the bars are those values in ms, a reused
    connection's connect is 0, the failed request has no bar."""
    recs = [_record(i, i * 1000, [i * 1000 + 500], [1]) for i in range(2)]
    recs.append(_record(2, 5000, [], [], ok=False))
    recs[0].conn_id, recs[0].conn_reused = 1, False
    recs[0].connect_ns, recs[0].tls_ns, recs[0].sending_ns = 300_000, 1_200_000, 10_000
    recs[0].waiting_ns, recs[0].first_token_ns, recs[0].queued_ns = 40_000, 450_000, 0
    recs[1].conn_id, recs[1].conn_reused = 1, True
    recs[1].sending_ns, recs[1].waiting_ns, recs[1].first_token_ns = 20_000, 30_000, 450_000
    recs[1].queued_ns = 2_500_000
    recs[2].conn_id = 2
    fig = phase_breakdown_figure(trace_from_records(recs))
    by_name = {t["name"]: t for t in fig["data"]}
    assert list(by_name) == ["connect", "TLS", "sending", "waiting", "first token"]
    assert all(t["type"] == "bar" and t["x"] == [0, 1] for t in fig["data"])
    assert by_name["connect"]["y"] == [0.3, 0.0]
    assert by_name["TLS"]["y"] == [1.2, 0.0]
    assert by_name["sending"]["y"] == [0.01, 0.02]
    assert by_name["waiting"]["y"] == [0.04, 0.03]
    assert by_name["first token"]["y"] == [0.45, 0.45]
    assert by_name["connect"]["customdata"] == [0.0, 2.5]  # queued, in the hover
    assert fig["layout"]["barmode"] == "stack"
    assert fig["layout"]["yaxis"]["title"]["text"] == "time (ms)"
    no_phases = phase_breakdown_figure(trace_from_records([_record(0, 0, [10], [1])]))
    assert no_phases["data"] == [] and "no connection phases" in str(no_phases["layout"])


def _axis_titles(fig: dict) -> list[tuple[str, str]]:
    lay = fig["layout"]
    return [
        (k, str((v.get("title") or {}).get("text") or ""))
        for k, v in lay.items()
        if re.fullmatch(r"[xy]axis\d*", k)
        and v.get("visible", True)
        and v.get("showticklabels", True)
    ]


def test_every_axis_is_labelled_with_its_unit() -> None:
    recs = [
        _record(i, i * 1000, [i * 1000 + 500 + k * 100 for k in range(5)], [1] * 5)
        for i in range(20)
    ]
    for r in recs:  # with connection phases, so the phase breakdown is drawn too
        r.conn_id, r.conn_reused, r.connect_ns, r.queued_ns = r.index + 1, False, 200_000, 0
    plots = run_figures(
        trace_from_records(recs),
        scheduled_ns=np.arange(20, dtype=np.int64) * 1000 - 7,
        turns=np.full(20, -1, np.int64),
    )
    units = re.compile(r"\((ms|s|tokens|tok/s|count|%|0–1)\)")
    checked = 0
    for key, fig in plots.figures.items():
        titles = _axis_titles(fig)
        assert titles, key
        for axis, text in titles:
            assert units.search(text), f"{key} {axis}: {text!r} names no unit"
            checked += 1
    assert checked >= 2 * len(plots.figures)
