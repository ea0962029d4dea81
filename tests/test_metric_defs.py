"""Every metric is defined once (app.analysis.metric_defs): the report, the CLI, the run
page, its figures and the comparisons read that definition."""

from __future__ import annotations

import numpy as np

from app.analysis import metric_defs as md
from app.analysis.metrics import compute_metrics
from app.cli import render
from app.domain import EventKind, RequestRecord, RequestStatus, trace_from_records
from app.figures import runs as run_figures
from app.services import compare as compare_svc
from app.web import runs_view


def _trace() -> object:
    recs = [
        RequestRecord(
            index=i,
            scheduled_ns=0,
            sent_ns=i * 1_000_000,
            end_ns=i * 1_000_000 + 50_000_000,
            status=RequestStatus.OK,
            input_tokens=8,
            output_tokens=3,
            event_t_ns=np.array([10, 20, 30], np.int64) * 1_000_000 + i * 1_000_000,
            event_bytes=np.array([5, 5, 5], np.int32),
            event_kind=np.array([int(EventKind.CONTENT)] * 3, np.int8),
            event_tokens=np.array([1, 1, 1], np.int32),
        )
        for i in range(4)
    ]
    return trace_from_records(recs)


def test_every_reported_distribution_is_defined() -> None:
    report = compute_metrics(_trace()).to_dict()  # type: ignore[arg-type]
    dists = {k for k, v in report.items() if k.endswith("_ms") and isinstance(v, dict)}
    dists.discard("slos_ms")  # the goodput SLOs asked for, not a measurement
    assert dists == {m.key for m in md.latencies()}
    assert report["aggregation"] == {m.key: m.aggregation for m in md.latencies()}
    for m in md.rates():
        assert m.key in report, m.key


def test_the_readers_read_the_definition() -> None:
    for key, label, per in render.latency_rows():
        assert (label, per) == (md.metric(key).label, md.metric(key).per)
    assert [k for k, _, _ in render.latency_rows()] == [m.key for m in md.latencies()]
    report = {"metrics": compute_metrics(_trace()).to_dict()}  # type: ignore[arg-type]
    rows = runs_view.metric_rows(report)
    assert [(r.key, r.label) for r in rows] == [(m.key, m.title) for m in md.shown("page")]
    figs = run_figures.run_figures(_trace()).figures  # type: ignore[arg-type]
    for m in md.shown("figures"):
        cdf = figs[f"cdf_{m.short_key}"]
        assert cdf["layout"]["xaxis"]["title"]["text"] == m.heading
    assert compare_svc.latency_labels() == {
        m.key: m.label for m in md.shown("compare") if m.aggregation != "per_run"
    }
    assert [m.key for m in compare_svc.scalar_metrics()] == [
        m.key for m in md.shown("compare") if m.aggregation == "per_run"
    ]


def test_formats_follow_the_unit() -> None:
    assert md.format_value(1234.5678, "ttft_ms", with_unit=True) == "1,234.57 ms"
    assert md.format_value(1234.5678, "output_throughput_tok_s") == "1,234.6"
    assert md.format_signed(-0.004, "tpot_ms") == "-0.00 ms"
    assert md.format_relative(0.1234) == "+12.3%"
    assert md.format_value(None, "ttft_ms") == "—"
    assert md.metric("e2el_ms").heading == "E2E latency (ms)"
