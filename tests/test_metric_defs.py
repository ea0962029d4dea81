"""Every metric is defined once (app.analysis.metric_defs): the report, the CLI, the run
page, its figures and the comparisons read that definition."""

from __future__ import annotations

import numpy as np
import pytest

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
            # the last request answers with a tool call (every metric has samples)
            event_kind=np.array(
                [int(EventKind.TOOL_CALL if i == 3 else EventKind.CONTENT)] * 3, np.int8
            ),
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


def test_the_registry_is_consistent() -> None:
    """Each metric's seeds are its own (a new metric moves no other interval), its short
    key is unique, a column it names exists, and every SLO is one a spec, the CLI and the
    launch form take."""
    from app.cli.args import parse_goodput
    from app.client.spec import RunSpec
    from app.storage.models import Request
    from app.web.launch_form import SLO_KEYS

    ms = list(md.METRICS.values())
    seeds = [m.seed for m in ms if m.aggregation != "per_run"]
    assert len(seeds) == len(set(seeds))
    compared = [m.compare_seed for m in md.shown("compare") if m.aggregation != "per_run"]
    assert len(compared) == len(set(compared))
    assert len({m.short_key for m in ms}) == len(ms)
    for m in ms:
        assert m.column is None or m.column in Request.__table__.c, m.key
    slos = {name: 100.0 for name in md.slo_metrics()}
    assert RunSpec(base_url="http://h:1", model="m", goodput=slos).goodput == slos
    assert parse_goodput([f"{k}:100" for k in slos]) == slos
    assert set(SLO_KEYS) == set(slos) == {"ttft", "user_ttft", "tpot", "e2el"}


def test_an_unknown_slo_is_refused_naming_the_known_ones() -> None:
    import pydantic

    from app.client.spec import RunSpec

    with pytest.raises(pydantic.ValidationError, match="unknown SLO 'ttfb'; expected one of ttft"):
        RunSpec(base_url="http://h:1", model="m", goodput={"ttfb": 1.0})


def test_metrics_of_a_run_follow_its_surface(monkeypatch: pytest.MonkeyPatch) -> None:
    """A metric limited to some surfaces or stream modes is left out of a run's views
    elsewhere (the endpoint registry marks TTFT/ITL/TPOT not applicable where no stream is)."""
    import dataclasses

    only_stream = dataclasses.replace(md.TPOT, streams=frozenset({"stream"}))
    only_chat = dataclasses.replace(md.TPOT, surfaces=frozenset({"chat"}))
    assert only_stream.applies("chat", True) and not only_stream.applies("chat", False)
    assert only_chat.applies("chat", None) and not only_chat.applies("embeddings", True)
    assert md.applies_to(only_chat, {"endpoint": "chat"})
    assert not md.applies_to(only_chat, {"endpoint": "embeddings"})
    assert md.applies_to(only_chat, None)  # an import says neither: it applies
    monkeypatch.setitem(md.METRICS, md.TPOT.key, only_chat)
    embeddings = {"endpoint": "embeddings", "stream": False}
    assert md.TPOT.key not in [k for k, _, _ in render.latency_rows(embeddings)]
    assert md.TPOT.key in [k for k, _, _ in render.latency_rows({"endpoint": "chat"})]
    assert md.TPOT.key not in [m.key for m in runs_view.applying("page", embeddings)]
