"""A multi-turn run's metrics by turn on its page, in its report and exports, checked
against a hand computation from the stored request rows; no event decoded."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from app.protocol.prometheus import Series
from app.services import server_metrics
from app.services.runs import open_database
from app.storage import interop as interop_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.storage.models import Request, Run
from app.targets.sim_config import SimConfig
from tests.web_support import bench, web_app

CONVERSATIONS = [["a b c d e f", "g h i", "j k"], ["l m n o", "p q r s t"], ["u v w x y z"]]


@dataclass(frozen=True)
class Runs:
    url: str
    sessions: sessionmaker[Session]
    multi: str
    single: str


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    tmp = tmp_path_factory.mktemp("turns")
    path = tmp / "conv.jsonl"
    path.write_text("".join(json.dumps({"turns": c}) + "\n" for c in CONVERSATIONS))
    url = f"sqlite:///{tmp / 't.db'}"
    sessions = open_database(url)
    sim = SimConfig(ttft_ms=8, itl_ms=1, itl_jitter_ms=0.5, seed=7)
    multi = bench(
        sessions, sim, "multi", dataset="jsonl", dataset_path=str(path), multi_turn=True,
        endpoint="chat", num_prompts=6, output_len=5, request_rate=50.0,
    )  # fmt: skip
    single = bench(sessions, sim, "single", num_prompts=5)
    return Runs(url, sessions, multi, single)


def _rows(sessions: sessionmaker[Session], run_id: str) -> list[Any]:
    t = Request.__table__
    with session_scope(sessions) as s:
        stmt = select(t).where(t.c.run_id == run_id, t.c.warmup.is_(False)).order_by(t.c.idx)
        return list(s.execute(stmt))


def _pct(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), by hand."""
    v = sorted(values)
    pos = (len(v) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _hand(rows: list[Any]) -> dict[int, dict[str, Any]]:
    """Per turn: requests, ok, and over the ok ones TTFT p50/p99, TTFT per prompt token p50
    and mean, TPOT p50, prompt tokens mean (ms), from the stored per-request columns."""
    out: dict[int, dict[str, Any]] = {}
    for k in sorted({r.turn_idx for r in rows}):
        of_turn = [r for r in rows if r.turn_idx == k]
        ok = [r for r in of_turn if r.status == "ok"]
        ttft = [r.ttft_ns / 1e6 for r in ok]
        per_tok = [r.ttft_ns / 1e6 / r.input_tokens for r in ok]
        tpot = [r.tpot_ns / 1e6 for r in ok if r.tpot_ns is not None]
        out[k] = {
            "requests": len(of_turn),
            "ok": len(ok),
            "ttft_p50": _pct(ttft, 50),
            "ttft_p99": _pct(ttft, 99),
            "per_tok_p50": _pct(per_tok, 50),
            "per_tok_mean": sum(per_tok) / len(per_tok),
            "tpot_p50": _pct(tpot, 50),
            "prompt_mean": sum(r.input_tokens for r in ok) / len(ok),
        }
    return out


def _no_event_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the run's events were decoded")

    monkeypatch.setattr(repo, "load_trace", boom)
    monkeypatch.setattr(repo, "unpack_many", boom)


def _check_table(table: list[dict[str, Any]], hand: dict[int, dict[str, Any]]) -> None:
    assert [r["turn"] for r in table] == sorted(hand)
    for r in table:
        h = hand[r["turn"]]
        assert (r["requests"], r["ok"]) == (h["requests"], h["ok"])
        assert r["ttft_ms"]["p50"] == pytest.approx(h["ttft_p50"], abs=1e-6)
        assert r["ttft_ms"]["p99"] == pytest.approx(h["ttft_p99"], abs=1e-6)
        assert r["ttft_per_prompt_token_ms"]["p50"] == pytest.approx(h["per_tok_p50"], abs=1e-6)
        assert r["ttft_per_prompt_token_ms"]["mean"] == pytest.approx(h["per_tok_mean"], abs=1e-6)
        assert r["tpot_ms"]["p50"] == pytest.approx(h["tpot_p50"], abs=1e-6)
        assert r["prompt_tokens"]["mean"] == pytest.approx(h["prompt_mean"])


def _page_cells(html: str, turn: int) -> list[str]:
    start = html.index(f'<tr data-turn="{turn}">')
    row = html[start : html.index("</tr>", start)]
    return [c.strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]


def _check_page(html: str, hand: dict[int, dict[str, Any]]) -> None:
    assert 'id="turns"' in html and 'id="fig-turn_ttft"' in html
    assert 'id="fig-turn_ttft_per_token"' in html and 'href="/runs/' in html
    for k, h in hand.items():
        cells = _page_cells(html, k)
        assert cells[0] == str(k)
        assert cells[1] == f"{h['ok']} / {h['requests']}"
        assert cells[2] == f"{h['ttft_p50']:,.2f}" and cells[3] == f"{h['ttft_p99']:,.2f}"
        assert cells[4] == f"{h['per_tok_p50']:,.4f}" and cells[5] == f"{h['per_tok_mean']:,.4f}"
        assert cells[6] == f"{h['tpot_p50']:,.2f}"
        assert cells[8] == f"{h['prompt_mean']:,.1f}"


def test_turn_table_on_the_page_report_and_turns_csv_matches_the_hand_computation(
    runs: Runs, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = _rows(runs.sessions, runs.multi)
    hand = _hand(rows)
    # 6 sessions over 3 conversations (cycled): turn 1 six times, turn 2 four, turn 3 two
    assert {k: h["requests"] for k, h in hand.items()} == {1: 6, 2: 4, 3: 2}
    assert hand[2]["prompt_mean"] > hand[1]["prompt_mean"]  # the history rides along
    _no_event_decode(monkeypatch)
    with TestClient(web_app(runs.url)) as c:
        page = c.get(f"/runs/{runs.multi}")
        assert page.status_code == 200, page.text[:300]
        _check_page(page.text, hand)
        assert f'href="/runs/{runs.multi}/turns.csv"' in page.text
        report = c.get(f"/runs/{runs.multi}/report.json").json()
        _check_table(report["turns"], hand)
        got = c.get(f"/runs/{runs.multi}/turns.csv")
        assert got.status_code == 200 and got.headers["content-type"].startswith("text/csv")
        lines = list(csv.DictReader(io.StringIO(got.text)))
        assert [int(r["turn"]) for r in lines] == [1, 2, 3]
        for r in lines:
            h = hand[int(r["turn"])]
            assert (int(r["requests"]), int(r["ok"])) == (h["requests"], h["ok"])
            assert float(r["ttft_ms_p50"]) == pytest.approx(h["ttft_p50"], abs=1e-6)
            assert float(r["ttft_ms_p99"]) == pytest.approx(h["ttft_p99"], abs=1e-6)
            assert float(r["ttft_per_prompt_token_ms_mean"]) == pytest.approx(
                h["per_tok_mean"], abs=1e-6
            )
            assert float(r["tpot_ms_p50"]) == pytest.approx(h["tpot_p50"], abs=1e-6)
            assert float(r["prompt_tokens_mean"]) == pytest.approx(h["prompt_mean"])
        api = c.get(f"/api/v1/runs/{runs.multi}/export/turns.csv")
        assert api.status_code == 200 and api.text == got.text


def test_a_run_stored_without_its_turn_table_computes_it_from_the_request_rows(
    runs: Runs, monkeypatch: pytest.MonkeyPatch
) -> None:
    with session_scope(runs.sessions) as s:
        load = dict(s.get(Run, runs.multi).load_stats or {})  # type: ignore[union-attr]
    stored = load.pop("turns")
    hand = _hand(_rows(runs.sessions, runs.multi))
    _check_table(stored, hand)  # what the client stored agrees with its request rows
    with session_scope(runs.sessions) as s:
        s.execute(update(Run).where(Run.id == runs.multi).values(load_stats=load))
    try:
        _no_event_decode(monkeypatch)
        with TestClient(web_app(runs.url)) as c:
            page = c.get(f"/runs/{runs.multi}")
            assert page.status_code == 200, page.text[:300]
            _check_page(page.text, hand)
            _check_table(c.get(f"/runs/{runs.multi}/report.json").json()["turns"], hand)
            summary = c.get(f"/runs/{runs.multi}/summary.json").json()
            _check_table(summary["report"]["turns"], hand)
    finally:
        with session_scope(runs.sessions) as s:
            s.execute(
                update(Run).where(Run.id == runs.multi).values(load_stats=load | {"turns": stored})
            )


def test_a_single_turn_run_has_no_turn_section(runs: Runs) -> None:
    with TestClient(web_app(runs.url)) as c:
        page = c.get(f"/runs/{runs.single}")
        assert page.status_code == 200
        assert 'id="turns"' not in page.text and "fig-turn_ttft" not in page.text
        assert "turns" not in c.get(f"/runs/{runs.single}/report.json").json()
        assert c.get(f"/runs/{runs.single}/turns.csv").text.startswith("turn,requests,ok,")
        assert len(c.get(f"/runs/{runs.single}/turns.csv").text.splitlines()) == 1


def test_request_exports_carry_session_and_turn(runs: Runs) -> None:
    import pyarrow.parquet as pq

    rows = _rows(runs.sessions, runs.multi)
    want = [(r.idx, r.session_idx, r.turn_idx) for r in rows]
    assert all(s is not None and t is not None for _, s, t in want)
    with TestClient(web_app(runs.url)) as c:
        got = list(csv.DictReader(io.StringIO(c.get(f"/runs/{runs.multi}/requests.csv").text)))
        measured = [r for r in got if r["warmup"] == "False"]
        assert [(int(r["idx"]), int(r["session"]), int(r["turn"])) for r in measured] == want
        jl = c.get(f"/runs/{runs.multi}/requests.jsonl").text.splitlines()
        objs = [json.loads(line) for line in jl]
        assert [(o["idx"], o["session"], o["turn"]) for o in objs if not o["warmup"]] == want
        table = pq.read_table(io.BytesIO(c.get(f"/runs/{runs.multi}/requests.parquet").content))
        cols = table.to_pydict()
        trip = zip(cols["idx"], cols["session"], cols["turn"], cols["warmup"], strict=True)
        assert [(i, s, t) for i, s, t, w in trip if not w] == want
        browse = c.get(f"/runs/{runs.multi}/requests").text
        _, s_, t_ = want[-1]
        assert f'title="session {s_}, turn {t_}">s{s_} t{t_}</span>' in browse
        api = c.get(f"/api/v1/runs/{runs.multi}/requests?limit=5000").json()["items"]
        assert [(r["index"], r["session"], r["turn"]) for r in api if not r["warmup"]] == want
        single = list(csv.DictReader(io.StringIO(c.get(f"/runs/{runs.single}/requests.csv").text)))
        assert single and all(r["session"] == "" and r["turn"] == "" for r in single)


def _counter(name: str, values: list[float]) -> Series:
    return Series(
        name, {"model_name": "m"}, "counter", [i * 10**9 for i in range(len(values))], values
    )


def test_prefix_cache_hit_ratio_beside_the_turn_table(runs: Runs) -> None:
    with TestClient(web_app(runs.url)) as c:
        text = c.get(f"/runs/{runs.multi}").text
        assert "Server prefix cache:" in text and "not exposed by the server" in text
        with session_scope(runs.sessions) as s:
            kept = interop_repo.load_server_metrics(s, runs.multi)  # the simulator's
            server_metrics.store(
                s,
                runs.multi,
                [
                    *kept,
                    _counter("vllm:prefix_cache_queries_total", [1000.0, 1100.0, 1400.0]),
                    _counter("vllm:prefix_cache_hits_total", [500.0, 560.0, 740.0]),
                    # the old name of the same counter, exposed beside it: not counted twice
                    _counter("vllm:gpu_prefix_cache_queries_total", [1000.0, 1100.0, 1400.0]),
                    _counter("vllm:gpu_prefix_cache_hits_total", [500.0, 560.0, 740.0]),
                ],
            )
        text = c.get(f"/runs/{runs.multi}").text
        assert "60.0% of 400 queried prompt tokens were hits (240;" in text


def _rec(
    idx: int, session: int, turn: int, ttft_ms: float, n: int, inp: int, ok: bool = True
) -> Any:
    import numpy as np

    from app.domain import RequestRecord, RequestStatus

    ms = 1_000_000
    first, last = int(ttft_ms * ms), int(ttft_ms * ms) + (n - 1) * 2 * ms  # TPOT 2 ms
    return RequestRecord(
        index=idx,
        scheduled_ns=0,
        sent_ns=0,
        end_ns=last,
        status=RequestStatus.OK if ok else RequestStatus.ERROR,
        error=None if ok else "boom",
        input_tokens=inp,
        output_tokens=n,
        session=session,
        turn=turn,
        event_t_ns=np.array([first, last], np.int64),
        event_bytes=np.array([10, 10], np.int32),
        event_kind=np.array([0, 0], np.int8),
        event_tokens=np.array([1, n - 1], np.int32),
    )


def test_turn_table_from_request_rows_on_sqlite_and_postgres(db_url: str) -> None:
    from app.analysis.metrics import per_request_metrics
    from app.analysis.turns import turn_table
    from app.client.spec import RunSpec
    from app.domain import RunStatus, trace_from_records
    from app.services import run_turns
    from app.services.runs import run_dict

    recs = [
        _rec(0, 0, 1, 100.0, 3, 50),  # 2 ms per prompt token
        _rec(1, 1, 1, 60.0, 3, 20),  # 3
        _rec(2, 2, 1, 999.0, 3, 10, ok=False),  # failed: counted as sent only
        _rec(3, 0, 2, 20.0, 1, 100),  # one token: no TPOT
        _rec(4, 1, 2, 30.0, 5, 60),  # 0.5
    ]
    spec = RunSpec(
        base_url="http://h:1", model="m", dataset="jsonl", dataset_path="/c.jsonl",
        multi_turn=True, endpoint="chat",
    )  # fmt: skip
    sessions = open_database(db_url)
    with session_scope(sessions) as s:
        run_id = repo.create_run(s, spec, status=RunStatus.SUCCEEDED)
        trace = trace_from_records(recs)
        repo.insert_requests(s, run_id, recs, per_request_metrics(trace))
    with session_scope(sessions) as s:
        run = run_dict(repo.get_run(s, run_id))
        table = run_turns.turn_table_of_run(s, run_id, run)
    assert table is not None
    t = {r["turn"]: r for r in table}
    assert (t[1]["requests"], t[1]["ok"], t[2]["requests"], t[2]["ok"]) == (3, 2, 2, 2)
    assert t[1]["ttft_ms"]["p50"] == pytest.approx(80.0)
    assert t[1]["ttft_ms"]["p99"] == pytest.approx(60.0 + 40.0 * 0.99)
    assert t[1]["ttft_per_prompt_token_ms"]["mean"] == pytest.approx(2.5)
    assert t[1]["tpot_ms"]["mean"] == pytest.approx(2.0)
    assert t[1]["prompt_tokens"]["mean"] == pytest.approx(35.0)
    assert t[2]["ttft_per_prompt_token_ms"]["p50"] == pytest.approx((0.2 + 0.5) / 2)
    assert t[2]["tpot_ms"]["n"] == 1 and t[2]["tpot_ms"]["mean"] == pytest.approx(2.0)
    assert t[2]["prompt_tokens"]["p50"] == pytest.approx(80.0)
    assert table == turn_table(recs)  # the rows give what the client computed at finalize
