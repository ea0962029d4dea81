"""Comparisons read the stored run summaries, never the events, and hold bounded samples:
the numbers are the ones a comparison from the events gives (and the ones recomputed from
the raw exports), a metric past the sample bound keeps its exact percentiles and count,
ids are compared once and capped before anything is read, an active run is refused, and
a sweep's summary is read the same way (SQLite and PostgreSQL)."""

from __future__ import annotations

import csv
import io
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from scipy import stats
from sqlalchemy.orm import Session, sessionmaker

from app.analysis.compare import CompareOptions, compare_samples
from app.analysis.metrics import itl_samples, per_request_metrics
from app.client.spec import RunSpec
from app.client.sweep_plan import step_dict, step_summary
from app.domain import EventKind, RequestRecord, RequestStatus, RunStatus
from app.services import compare as compare_svc
from app.services import exports, run_summaries
from app.services import runs as run_svc
from app.services import sweeps as sweep_svc
from app.services.errors import Conflict
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage.db import make_engine, session_factory, session_scope
from tests.web_support import web_app

MS = 1_000_000
N_REQUESTS = 120


def _records(seed: int, ttft_ms: float, gap_ms: float) -> list[RequestRecord]:
    """Seeded requests: two warmups, one error in ten, chunks of 1 to 3 tokens (per-token
    ITL samples differ from per-chunk ones), one request answered in a single chunk."""
    rng = np.random.default_rng(seed)
    out: list[RequestRecord] = []
    for i in range(N_REQUESTS):
        sent = i * 20 * MS + 1000
        if i % 10 == 7:
            out.append(
                RequestRecord(
                    index=i, scheduled_ns=sent, sent_ns=sent, end_ns=sent + 3 * MS,
                    status=RequestStatus.ERROR, error="HTTP 500: boom", http_status=500,
                    input_tokens=50,
                )
            )  # fmt: skip
            continue
        n_chunks = 1 if i == 11 else int(rng.integers(4, 30))
        gaps = rng.gamma(4.0, gap_ms / 4.0, n_chunks - 1) * MS
        first = sent + int(rng.normal(ttft_ms, ttft_ms / 8) * MS)
        t = first + np.concatenate([[0], np.cumsum(gaps)]).astype(np.int64)
        toks = rng.integers(1, 4, n_chunks).astype(np.int32)
        out.append(
            RequestRecord(
                index=i, scheduled_ns=sent, sent_ns=sent, end_ns=int(t[-1]) + MS,
                done_ns=int(t[-1]) + MS, status=RequestStatus.OK, input_tokens=50 + i % 7,
                output_tokens=int(toks.sum()), token_source="usage", warmup=i < 2,
                event_t_ns=t, event_bytes=np.full(n_chunks, 12, np.int32),
                event_kind=np.full(n_chunks, EventKind.CONTENT, np.int8), event_tokens=toks,
            )
        )  # fmt: skip
    return out


@dataclass
class Lab:
    url: str
    sessions: sessionmaker[Session]
    base: str
    same: str
    worse: str


def _store(sessions: sessionmaker[Session], name: str, records: list[RequestRecord]) -> str:
    spec = RunSpec(base_url="http://h:1", model="m", num_prompts=N_REQUESTS, warmup_requests=2)
    with session_scope(sessions) as s:
        run_id = repo.create_run(s, spec, name=name, status=RunStatus.RUNNING)
        run_svc.store_requests(s, run_id, records)
    run_svc.finalize_run(sessions, run_id, status=RunStatus.SUCCEEDED, meta=None)
    return run_id


@pytest.fixture
def lab(db_url: str) -> Iterator[Lab]:
    engine = make_engine(db_url)
    sessions = session_factory(engine)
    base = _store(sessions, "base", _records(1, 40.0, 2.0))
    same = _store(sessions, "same", _records(2, 40.0, 2.0))
    worse = _store(sessions, "worse", _records(3, 60.0, 2.6))
    yield Lab(db_url, sessions, base, same, worse)
    engine.dispose()


def _no_event_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("a comparison decoded a run's events")

    monkeypatch.setattr(repo, "load_trace", boom)
    monkeypatch.setattr(repo, "unpack_many", boom)


# --------------------------------------------------------------- the same numbers as before


def _from_events(sessions: sessionmaker[Session], run_id: str) -> dict[str, Any]:
    """A run's samples as the comparison read them from the events before summaries."""
    with session_scope(sessions) as s:
        trace = repo.load_trace(s, run_id)
    prm = per_request_metrics(trace)
    itl = itl_samples(trace)
    raw = itl.per_token if itl.per_token is not None else itl.per_chunk()
    return {
        "ttft_ms": prm.ttft_ns / MS,
        "tpot_ms": prm.tpot_ns / MS,
        "e2el_ms": prm.e2e_ns / MS,
        "itl_ms": np.asarray(raw, np.float64) / MS,
    }


def test_compare_gives_the_numbers_a_comparison_from_the_events_gives(lab: Lab) -> None:
    out = compare_svc.compare_runs(lab.sessions, lab.base, [lab.same, lab.worse])
    base = _from_events(lab.sessions, lab.base)
    for pair, cand_id in zip(out["pairs"], (lab.same, lab.worse), strict=True):
        cand = _from_events(lab.sessions, cand_id)
        # each metric's bootstrap seed is fixed (Metric.compare_seed), whatever its place
        seeds = {"ttft_ms": 0, "tpot_ms": 1, "e2el_ms": 2, "itl_ms": 3}
        assert set(pair["metrics"]) == set(seeds)
        for key, seed in seeds.items():
            opts = CompareOptions(seed=seed)
            want = compare_samples(key, base[key], cand[key], opts).to_dict()
            if key == "itl_ms":
                note = compare_svc.POOLED_NOTE.format(label="ITL", per="token")
                want["notes"] = [*want["notes"], note]  # type: ignore[list-item]
            assert pair["metrics"][key] == want, key
    assert out["pairs"][1]["verdicts"]["ttft_ms"] == "regressed"
    with session_scope(lab.sessions) as s:
        run = run_svc.run_dict(repo.get_run(s, lab.base))
        trace = repo.load_trace(s, lab.base)
    report = run_svc.assemble_report(run=run, trace=trace)
    entry = out["runs"][0]
    assert entry["headline"] == run_svc.headline(report)
    assert entry["diagnosis"] == compare_svc.trace_diagnosis(run, trace, report)


def _export_rows(sessions: sessionmaker[Session], run_id: str) -> tuple[list[Any], list[Any]]:
    reqs = list(
        csv.DictReader(io.StringIO(exports.export(sessions, run_id, "requests.csv").decode()))
    )
    events = [
        json.loads(line)
        for line in exports.export(sessions, run_id, "events.jsonl").decode().splitlines()
    ]
    return reqs, events


def _itl_from_events(reqs: list[Any], events: list[Any]) -> list[float]:
    """Per-token ITL from the events export: a chunk of k tokens g after the previous one
    gives k gaps g/k; a request's first chunk of k tokens k - 1 zeros; a request whose
    tokens came in one chunk none (SPEC, ``ItlSamples``)."""
    ok = {
        int(r["idx"])
        for r in reqs
        if r["status"] == "ok" and r["warmup"] in ("", "False", "false", "0")
    }
    by_req: dict[int, list[tuple[float, int]]] = {}
    for e in events:
        if e["idx"] in ok and e["kind"] in ("content", "reasoning") and e["tokens"] > 0:
            by_req.setdefault(e["idx"], []).append((e["t_ms"], e["tokens"]))
    out: list[float] = []
    for chunks in by_req.values():
        if len(chunks) < 2:
            continue
        out += [0.0] * (chunks[0][1] - 1)
        for (t0, _), (t1, k) in itertools.pairwise(chunks):
            out += [(t1 - t0) / k] * k
    return out


def test_compare_agrees_with_the_raw_exports(lab: Lab) -> None:
    out = compare_svc.compare_runs(lab.sessions, lab.base, [lab.worse])
    pair = out["pairs"][0]
    sides = [_export_rows(lab.sessions, i) for i in (lab.base, lab.worse)]

    def column(reqs: list[Any], key: str) -> np.ndarray:
        vals = [
            float(r[key])
            for r in reqs
            if r["warmup"] in ("", "False", "false", "0") and r[key] != ""
        ]
        return np.asarray(vals)

    for key, got in pair["metrics"].items():
        if key == "itl_ms":
            a, b = (np.asarray(_itl_from_events(*side)) for side in sides)
        else:
            a, b = (column(side[0], key) for side in sides)
        assert (got["n_baseline"], got["n_candidate"]) == (a.size, b.size), key
        for row in got["percentiles"]:
            assert row["baseline"] == pytest.approx(np.percentile(a, row["p"]), rel=1e-6), key
            assert row["candidate"] == pytest.approx(np.percentile(b, row["p"]), rel=1e-6), key
        ref = stats.mannwhitneyu(b, a, alternative="two-sided", method="asymptotic")
        assert got["mann_whitney"]["p_value"] == pytest.approx(ref.pvalue, rel=1e-6, abs=1e-12)


def test_compare_pages_and_api_decode_no_event(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    before = compare_svc.compare_runs(lab.sessions, lab.base, [lab.worse])
    _no_event_decode(monkeypatch)
    assert compare_svc.compare_runs(lab.sessions, lab.base, [lab.worse]) == before
    with TestClient(web_app(lab.url)) as c:
        r = c.get(f"/api/v1/compare/{lab.base}", params={"ids": lab.worse})
        assert r.status_code == 200, r.text
        assert r.json()["pairs"][0]["verdict"] == before["pairs"][0]["verdict"]
        page = c.get(f"/compare?ids={lab.base}&ids={lab.worse}")
        assert page.status_code == 200 and 'id="compare-table"' in page.text
        assert "seeded random subsample" in page.text  # the method names the bound


# ---------------------------------------------------------------- bounded samples


def test_a_metric_past_the_bound_keeps_exact_percentiles(lab: Lab) -> None:
    """A run summarized with an ITL sample bound of 200 and read with a bound of 40 per
    metric: every metric is subsampled (seeded: the same twice), its counts and percentiles
    stay those of every sample, and the pair says how it was computed."""
    with session_scope(lab.sessions) as s:
        full = {i: _from_events(lab.sessions, i) for i in (lab.base, lab.worse)}
        for run_id in (lab.base, lab.worse):
            summary = run_summaries.compute_summary(s, run_id)
            trace = repo.load_trace(s, run_id)
            small = run_summaries.summarize(
                trace,
                scheduled_ns=np.zeros(trace.n_requests, np.int64),
                turns=np.full(trace.n_requests, -1, np.int64),
                indexes=np.arange(trace.n_requests),
                itl_sample_max=200,
            )
            n = summary.sample_counts["itl_ms"]
            assert small.sample_counts["itl_ms"] == n > 200
            assert small.samples is not None and small.samples["itl_ms"].size == 200
            run_summaries.put(s, run_id, small)
    runs = [compare_svc.load_samples(lab.sessions, i, sample_max=40) for i in (lab.base, lab.worse)]
    again = compare_svc.load_samples(lab.sessions, lab.base, sample_max=40)
    for key, values in runs[0].samples_ms.items():
        assert values.size == 40 and np.array_equal(values, again.samples_ms[key]), key
        everything = full[lab.base][key]
        assert np.isin(values, everything).all(), key  # drawn from the run's own samples
    out = compare_svc.compare_loaded(runs)
    for key, got in out["pairs"][0]["metrics"].items():
        a, b = (full[i][key][np.isfinite(full[i][key])] for i in (lab.base, lab.worse))
        assert (got["n_baseline"], got["n_candidate"]) == (a.size, b.size), key
        for row in got["percentiles"]:
            assert row["baseline"] == pytest.approx(np.percentile(a, row["p"]), rel=1e-9)
            assert row["candidate"] == pytest.approx(np.percentile(b, row["p"]), rel=1e-9)
            assert row["delta"] == pytest.approx(row["candidate"] - row["baseline"], rel=1e-9)
        assert any("subsample of 40" in n for n in got["notes"]), got["notes"]


# --------------------------------------------------------------- ids and states


def test_ids_are_compared_once_and_capped_before_any_read(lab: Lab) -> None:
    with TestClient(web_app(lab.url)) as c:
        r = c.get(f"/api/v1/compare/{lab.base}", params={"ids": ",".join([lab.worse] * 6)})
        assert r.status_code == 200 and len(r.json()["pairs"]) == 1
        r = c.get(f"/api/v1/compare/{lab.base}", params={"ids": f"{lab.base},{lab.worse}"})
        assert r.status_code == 200 and [p["candidate"] for p in r.json()["pairs"]] == [lab.worse]
        six = ",".join(f"nope{i}" for i in range(6))  # unknown ids: refused before a lookup
        r = c.get(f"/api/v1/compare/{lab.base}", params={"ids": six})
        assert r.status_code == 422 and "at most 6 runs" in r.text, r.text
        page = c.get("/compare", params={"ids": [lab.base] * 5 + [lab.worse]})
        assert page.status_code == 200 and page.text.count(" pair-verdict ") == 1
        page = c.get("/compare", params={"ids": [f"nope{i}" for i in range(7)]})
        assert page.status_code == 422 and "at most 6 runs" in page.text


def test_an_active_run_is_refused(lab: Lab) -> None:
    with session_scope(lab.sessions) as s:
        running = repo.create_run(
            s, RunSpec(base_url="http://h:1", model="m"), status=RunStatus.RUNNING
        )
    with pytest.raises(Conflict, match="running"):
        compare_svc.compare_runs(lab.sessions, lab.base, [running])
    with TestClient(web_app(lab.url)) as c:
        r = c.get(f"/api/v1/compare/{lab.base}", params={"ids": running})
        assert r.status_code == 409 and "once it has finished" in r.text


# --------------------------------------------------------------- sweeps


def test_sweep_summary_reads_stored_summaries(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    with session_scope(lab.sessions) as s:
        sweep_id = compare_repo.create_sweep(s, spec={}, mode="rates", loads=[10.0, 20.0])
        for k, run_id in enumerate((lab.base, lab.worse)):
            compare_repo.add_step(
                s, sweep_id, step_idx=k, run_id=run_id, load=10.0 * (k + 1), load_kind="rate"
            )
    want = []
    for k, run_id in enumerate((lab.base, lab.worse)):
        with session_scope(lab.sessions) as s:
            run = run_svc.run_dict(repo.get_run(s, run_id))
            trace = repo.load_trace(s, run_id)
        report = run_svc.assemble_report(run=run, trace=trace)
        want.append(step_dict(step_summary(k, 10.0 * (k + 1), "rate", report, trace, run_id)))
    _no_event_decode(monkeypatch)
    got = sweep_svc.sweep_summary(lab.sessions, sweep_id)["steps"]
    assert [{k: v for k, v in s.items() if k in want[0]} for s in got] == want
    out = compare_svc.compare_sweeps(lab.sessions, sweep_id, sweep_id)
    assert out["common_loads"] == [10.0, 20.0]
