"""The run page's stored summary (migration 0011): computed at finalize, the same numbers
as a full computation from the events, recomputed when missing or stale, and a finished
run's page decodes no event (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from app.client.spec import RunSpec
from app.domain import EventKind, RequestRecord, RequestStatus, RunStatus
from app.figures.runs import run_figures
from app.figures.scriptjson import plotly_json
from app.services import run_summaries
from app.services import runs as run_svc
from app.storage import repository as repo
from app.storage import summaries as summary_repo
from app.storage.db import make_engine, session_factory, session_scope
from app.storage.models import RunPageSummary
from tests.web_support import web_app

MS = 1_000_000
# four ok requests (TTFT 20, 30, 40, 50 ms; 4 one-token chunks 5 ms apart) and one error
TTFT_MS = (20, 30, 40, 50)


def _records() -> list[RequestRecord]:
    out: list[RequestRecord] = []
    for i, ttft in enumerate(TTFT_MS):
        sent = i * 100 * MS + MS
        t = sent + ttft * MS + np.arange(4, dtype=np.int64) * 5 * MS
        out.append(
            RequestRecord(
                index=i,
                scheduled_ns=i * 100 * MS,
                sent_ns=sent,
                end_ns=int(t[-1]) + MS,
                done_ns=int(t[-1]) + MS,
                status=RequestStatus.OK,
                input_tokens=100 + i,
                output_tokens=4,
                token_source="usage",
                event_t_ns=t,
                event_bytes=np.full(4, 10, np.int32),
                event_kind=np.full(4, EventKind.CONTENT, np.int8),
                event_tokens=np.ones(4, np.int32),
            )
        )
    out.append(
        RequestRecord(
            index=4,
            scheduled_ns=400 * MS,
            sent_ns=401 * MS,
            end_ns=403 * MS,
            status=RequestStatus.ERROR,
            error="HTTP 500: boom",
            http_status=500,
            input_tokens=100,
        )
    )
    return out


# window: first send (1 ms) .. the error's end (403 ms) = 0.402 s
WINDOW_S = 0.402


@dataclass
class Stored:
    url: str
    sessions: sessionmaker[Session]
    run_id: str


@pytest.fixture
def stored(db_url: str) -> Iterator[Stored]:
    engine = make_engine(db_url)
    sessions = session_factory(engine)
    spec = RunSpec(base_url="http://h:1", model="m", num_prompts=5, goodput={"ttft": 100.0})
    with session_scope(sessions) as s:
        run_id = repo.create_run(s, spec, name="small", status=RunStatus.RUNNING)
        run_svc.store_requests(s, run_id, _records())
    run_svc.finalize_run(sessions, run_id, status=RunStatus.SUCCEEDED, meta=None)
    yield Stored(db_url, sessions, run_id)
    engine.dispose()


def _plain(obj: Any) -> Any:
    """As JSON reads it back (tuples become lists; NaN stays NaN)."""
    return json.loads(json.dumps(obj))


def _full(st: Stored, **kw: Any) -> dict[str, Any]:
    with session_scope(st.sessions) as s:
        run = run_svc.run_dict(repo.get_run(s, st.run_id))
        trace = repo.load_trace(s, st.run_id)
    return run_svc.assemble_report(run=run, trace=trace, **kw)


def _from_summary(st: Stored, **kw: Any) -> dict[str, Any]:
    with session_scope(st.sessions) as s:
        run = run_svc.run_dict(repo.get_run(s, st.run_id))
        summary = run_summaries.fresh_summary(s, st.run_id)
    assert summary is not None, "finalize stored no summary"
    return run_svc.summary_report(run, summary, **kw)


def test_stored_summary_gives_the_hand_computed_numbers(stored: Stored) -> None:
    m = _from_summary(stored)["metrics"]
    assert m["requests"]["completed_ok"] == 4 and m["requests"]["failed"] == 1
    assert m["ttft_ms"]["p50"] == pytest.approx(35.0)  # median of 20, 30, 40, 50
    assert m["tpot_ms"]["mean"] == pytest.approx(5.0)
    assert m["e2el_ms"]["max"] == pytest.approx(65.0)
    assert m["window"]["duration_s"] == pytest.approx(WINDOW_S)
    assert m["output_throughput_tok_s"] == pytest.approx(16 / WINDOW_S)
    assert m["good_requests"] == 4  # the spec's TTFT SLO of 100 ms: every ok request
    assert m["goodput_req_s"] == pytest.approx(4 / WINDOW_S)
    # custom SLOs from per-request values: TTFT <= 35 ms: 2; E2E <= 45 ms: 2; TPOT <= 4: 0
    for slos, good in (({"ttft": 35.0}, 2), ({"e2el": 45.0}, 2), ({"tpot": 4.0}, 0)):
        got = _from_summary(stored, slos_ms=slos)["metrics"]
        assert got["good_requests"] == good, slos
        assert got["goodput_req_s"] == pytest.approx(good / WINDOW_S)
        assert got["slos_ms"] == slos


@pytest.mark.parametrize(
    "slos",
    [None, {}, {"ttft": 35.0}, {"ttft": 25.0, "tpot": 6.0, "e2el": 60.0}, {"user_ttft": 30.0}],
)
def test_stored_summary_report_equals_the_full_computation(
    stored: Stored, slos: dict[str, float] | None
) -> None:
    assert _plain(_from_summary(stored, slos_ms=slos)) == _plain(_full(stored, slos_ms=slos))
    assert "vllm-legacy" in run_summaries.STORED_PROFILES
    for profile in run_summaries.STORED_PROFILES:
        ours = _from_summary(stored, slos_ms=slos, profile=profile)
        assert _plain(ours) == _plain(_full(stored, slos_ms=slos, profile=profile))


def test_stored_figures_equal_the_figures_from_the_events(stored: Stored) -> None:
    with session_scope(stored.sessions) as s:
        trace = repo.load_trace(s, stored.run_id)
        summary = run_summaries.fresh_summary(s, stored.run_id)
    assert summary is not None
    sched = np.arange(5, dtype=np.int64) * 100 * MS
    turns = np.full(5, -1, np.int64)  # single requests
    figs = run_figures(trace, scheduled_ns=sched, turns=turns, indexes=np.arange(5))
    assert summary.figures == {k: plotly_json(f) for k, f in figs.figures.items()}
    ttft = json.loads(summary.figures["cdf_ttft"])["data"][0]["x"]
    assert sorted(ttft) == pytest.approx([20.0, 30.0, 40.0, 50.0])
    assert summary.n_events == 16 and summary.n_requests == 5


def _goodput_card(html: str) -> str:
    m = re.search(r'id="card-goodput">.*?<div class="value">(.*?)</div>', html, re.S)
    assert m, "goodput card missing"
    return m.group(1).strip()


def _no_event_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the run page decoded the run's events")

    monkeypatch.setattr(repo, "load_trace", boom)
    monkeypatch.setattr(repo, "unpack_many", boom)


def test_finished_run_page_decodes_no_event(
    stored: Stored, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_event_decode(monkeypatch)
    with TestClient(web_app(stored.url)) as c:
        page = c.get(f"/runs/{stored.run_id}")
        assert page.status_code == 200, page.text[:300]
        assert _goodput_card(page.text) == f"{4 / WINDOW_S:.2f} req/s"
        assert 'id="fig-cdf_ttft"' in page.text and 'id="fig-server_metrics"' in page.text
        slo = c.get(f"/runs/{stored.run_id}?slo=1&slo_ttft=35")
        assert slo.status_code == 200 and _goodput_card(slo.text) == f"{2 / WINDOW_S:.2f} req/s"
        prof = c.get(f"/runs/{stored.run_id}?profile=vllm")
        assert prof.status_code == 200 and 'id="profile-table"' in prof.text


def _version(st: Stored) -> int | None:
    with session_scope(st.sessions) as s:
        row = summary_repo.get_summary(s, st.run_id)
    return None if row is None else row.version


def test_missing_or_stale_summary_is_recomputed_and_stored(stored: Stored) -> None:
    with TestClient(web_app(stored.url)) as c:
        with session_scope(stored.sessions) as s:
            assert summary_repo.delete_summary(s, stored.run_id)
        assert _version(stored) is None
        page = c.get(f"/runs/{stored.run_id}")
        assert page.status_code == 200
        assert _goodput_card(page.text) == f"{4 / WINDOW_S:.2f} req/s"
        assert _version(stored) == run_summaries.SUMMARY_VERSION  # stored on the first view
        with session_scope(stored.sessions) as s:  # an older layout: stale
            s.execute(update(RunPageSummary).values(version=run_summaries.SUMMARY_VERSION - 1))
        with session_scope(stored.sessions) as s:
            assert run_summaries.fresh_summary(s, stored.run_id) is None
        assert c.get(f"/runs/{stored.run_id}").status_code == 200
        assert _version(stored) == run_summaries.SUMMARY_VERSION
        # a request stored after the summary (another count): stale, recomputed with it
        extra = _records()[0]
        extra.index = 5
        with session_scope(stored.sessions) as s:
            run_svc.store_requests(s, stored.run_id, [extra])
            assert run_summaries.fresh_summary(s, stored.run_id) is None
        assert c.get(f"/runs/{stored.run_id}").status_code == 200
        with session_scope(stored.sessions) as s:
            fresh = run_summaries.fresh_summary(s, stored.run_id)
        assert fresh is not None and fresh.n_requests == 6
        assert fresh.metrics["requests"]["completed_ok"] == 5


def test_active_run_page_is_live_and_stores_nothing(stored: Stored) -> None:
    with session_scope(stored.sessions) as s:
        summary_repo.delete_summary(s, stored.run_id)
        repo.update_run(s, stored.run_id, status=RunStatus.RUNNING)
    with TestClient(web_app(stored.url)) as c:
        page = c.get(f"/runs/{stored.run_id}?profile=aiperf")
        assert page.status_code == 200 and 'id="profile-table"' in page.text
        assert _goodput_card(page.text) == f"{4 / WINDOW_S:.2f} req/s"
    assert _version(stored) is None


def test_imported_run_page_compares_with_the_file_without_decoding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.services.file_imports import import_path
    from app.services.import_compare import import_comparison
    from app.storage import interop as interop_repo
    from app.web.interop_run import add_interop
    from app.web.runs_page import load_run, run_context

    url = f"sqlite:///{tmp_path / 'gl.db'}"
    sessions = run_svc.open_database(url)
    fixture = Path(__file__).parent / "fixtures" / "interop" / "guidellm-benchmarks.json"
    run_id = import_path(sessions, "guidellm", fixture, name="gl")[0]
    with session_scope(sessions) as s:
        info = interop_repo.get_import(s, run_id)
        assert info is not None and info.profile == "guidellm"
        group = interop_repo.group_runs(s, info.group_id)
        expected = import_comparison(info, repo.load_trace(s, run_id), group)
    assert expected.rows  # the file's figures beside ours
    _no_event_decode(monkeypatch)
    data = load_run(sessions, run_id, profile="vllm")
    ctx = run_context(data, slos_ms={"ttft": 50.0}, slo_errors={}, profile="vllm")
    add_interop(ctx, sessions, run_id, data.summary)
    assert ctx["imported"] == expected
    assert ctx["comparison"] and "send_lag" not in ctx["figures"]
    with TestClient(web_app(url)) as c:
        assert c.get(f"/runs/{run_id}?profile=guidellm").status_code == 200


def test_report_downloads_of_a_finished_run_decode_no_event(
    stored: Stored, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.storage.jsonsafe import json_safe

    slo_full = json_safe(_full(stored, slos_ms={"ttft": 35.0}))
    vllm_full = json_safe(_full(stored, profile="vllm"))
    legacy_full = json_safe(_full(stored, profile="vllm-legacy"))
    _no_event_decode(monkeypatch)
    with TestClient(web_app(stored.url)) as c:
        got = c.get(f"/runs/{stored.run_id}/report.json?slo=1&slo_ttft=35")
        assert got.status_code == 200, got.text[:300]
        assert got.json() == _plain(slo_full)
        assert got.json()["metrics"]["good_requests"] == 2
        api = c.get(f"/api/v1/runs/{stored.run_id}?profile=vllm")
        assert api.status_code == 200, api.text[:300]
        assert api.json()["report"] == _plain(vllm_full)
        # the older vLLM definitions too: stored at finalize, not recomputed per request
        legacy = c.get(f"/api/v1/runs/{stored.run_id}?profile=vllm-legacy")
        assert legacy.status_code == 200, legacy.text[:300]
        assert legacy.json()["report"] == _plain(legacy_full)
        legacy_file = c.get(f"/runs/{stored.run_id}/report.json?profile=vllm-legacy")
        assert legacy_file.status_code == 200
        assert legacy_file.json()["profile"]["name"] == "vllm-legacy"
    assert run_svc.run_report(stored.sessions, stored.run_id)["metrics"]["good_requests"] == 4
