"""The prompt tokens a server says it served from its prefix cache, per request: read off the
stream's usage chunk (``usage.prompt_tokens_details.cached_tokens``, else llama.cpp's
``timings.cache_n``), bounded, carried over the wire, stored on SQLite and PostgreSQL,
exported, and summed per turn."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.analysis.prefix_cache import responses_prefix_cache
from app.analysis.turns import csv_columns, flat_rows, turn_table
from app.cli.render import prefix_cache_line
from app.client.events import cached_prompt_tokens, classify
from app.client.raw_stream import RawStream
from app.client.spec import RunSpec
from app.client.tokenizer import BuiltinTokenizer
from app.domain import RequestRecord, RequestStatus, RunStatus, trace_from_records
from app.protocol.wire import WireRequest
from app.services import run_turns
from app.services.runs import open_database, run_dict
from app.storage import browse
from app.storage import repository as repo
from app.storage.db import session_scope
from tests.record_support import finish_record

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "shared" / "sse"


def _usage_event(name: str) -> tuple[dict[str, Any] | None, bytes | None]:
    """The last event of a fixture that carried a usage object, as the record keeps it."""
    usage: dict[str, Any] | None = None
    data: bytes | None = None
    for line in (FIXTURES / name).read_bytes().splitlines():
        if not line.startswith(b"data: "):
            continue
        d = line[len(b"data: ") :]
        c = classify(d)
        if c.usage is not None:
            usage, data = c.usage, d
    return usage, data


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("llamacpp-chat.sse", 0),
        ("llamacpp-completions.sse", 0),
        ("transformers-serve-chat.sse", None),
        ("transformers-serve-completions.sse", None),
    ],
)
def test_cached_tokens_from_real_fixture_chunks(name: str, want: int | None) -> None:
    usage, data = _usage_event(name)
    assert usage is not None
    assert cached_prompt_tokens(usage, data) == want


def _chunk(usage: dict[str, Any], **extra: Any) -> tuple[dict[str, Any] | None, bytes]:
    data = json.dumps({"choices": [], "usage": usage, **extra}).encode()
    return classify(data).usage, data


def test_cached_tokens_positive_missing_and_the_timings_fallback() -> None:
    base = {"prompt_tokens": 300, "completion_tokens": 8}
    assert (
        cached_prompt_tokens(*_chunk(base | {"prompt_tokens_details": {"cached_tokens": 256}}))
        == 256
    )
    assert cached_prompt_tokens(*_chunk(base)) is None  # the server did not say
    assert cached_prompt_tokens(*_chunk(base | {"prompt_tokens_details": {}})) is None
    assert cached_prompt_tokens(*_chunk(base | {"prompt_tokens_details": None})) is None
    # llama.cpp's timings on the same chunk when the usage object has no details
    assert cached_prompt_tokens(*_chunk(base, timings={"cache_n": 37, "prompt_n": 263})) == 37
    # the details win over the timings
    both = _chunk(base | {"prompt_tokens_details": {"cached_tokens": 5}}, timings={"cache_n": 9})
    assert cached_prompt_tokens(*both) == 5
    assert cached_prompt_tokens(None, b'{"timings":{"cache_n":3}}') is None  # no usage at all
    assert cached_prompt_tokens(base, None) is None


@pytest.mark.parametrize("bad", ["12", 1.5, True, -1, 2**63, 10**30, None, [3], {"n": 1}])
def test_cached_tokens_hostile_values_are_unknown(bad: Any) -> None:
    base = {"prompt_tokens": 30, "completion_tokens": 8}
    assert (
        cached_prompt_tokens(*_chunk(base | {"prompt_tokens_details": {"cached_tokens": bad}}))
        is None
    )
    assert cached_prompt_tokens(*_chunk(base, timings={"cache_n": bad})) is None
    assert cached_prompt_tokens(*_chunk(base, timings=bad)) is None
    assert cached_prompt_tokens(*_chunk(base | {"prompt_tokens_details": bad})) is None
    assert (
        cached_prompt_tokens(
            *_chunk(base | {"prompt_tokens_details": {"cached_tokens": 2**63 - 1}})
        )
        == 2**63 - 1
    )


def _raw(chunks: list[bytes]) -> RawStream:
    raw = RawStream("t-0", status=RequestStatus.OK, http_status=200, t0_ns=1_000)
    for i, c in enumerate(chunks):
        raw.ev_t.append(2_000 + i)
        raw.ev_bytes.append(len(c))
        raw.ev_data.append(c)
    raw.end_ns = raw.done_ns = 9_000
    raw.finalized = True
    return raw


@pytest.mark.parametrize(
    ("details", "want"),
    [
        ({"cached_tokens": 17}, 17),
        ({"cached_tokens": -4}, None),
        ({"cached_tokens": "17"}, None),
        (None, None),
    ],
)
def test_the_record_keeps_the_last_usage_chunks_cached_count(
    details: dict[str, Any] | None, want: int | None
) -> None:
    usage: dict[str, Any] = {"prompt_tokens": 40, "completion_tokens": 2}
    if details is not None:
        usage["prompt_tokens_details"] = details
    chunks = [
        b'{"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":40,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":99}}}',
        b'{"choices":[{"delta":{"content":" b"}}]}',
        json.dumps({"choices": [], "usage": usage}).encode(),
        b"[DONE]",
    ]
    rec = finish_record(
        _raw(chunks), index=0, scheduled_ns=0, run_start_ns=0,
        tokenizer=BuiltinTokenizer(), token_counting="auto",
    )  # fmt: skip
    assert rec.status is RequestStatus.OK, rec.error
    assert rec.usage_prompt_tokens == 40 and rec.cached_prompt_tokens == want


def test_the_wire_carries_the_count_and_drops_one_past_64_bits() -> None:
    rec = RequestRecord(index=0, scheduled_ns=0, sent_ns=0, end_ns=1, status=RequestStatus.OK)
    rec.cached_prompt_tokens = 12
    assert WireRequest.from_record(rec).to_record().cached_prompt_tokens == 12
    rec.cached_prompt_tokens = 2**64
    assert WireRequest.from_record(rec).cached_prompt_tokens is None
    old = WireRequest.from_record(rec).model_dump()
    del old["cached_prompt_tokens"]  # an older worker: unknown
    assert WireRequest.model_validate(old).to_record().cached_prompt_tokens is None


def _rec(idx: int, turn: int, inp: int, cached: int | None, *, ok: bool = True) -> RequestRecord:
    ms = 1_000_000
    return RequestRecord(
        index=idx,
        scheduled_ns=0,
        sent_ns=0,
        end_ns=30 * ms,
        status=RequestStatus.OK if ok else RequestStatus.ERROR,
        error=None if ok else "boom",
        input_tokens=inp,
        output_tokens=3,
        usage_prompt_tokens=inp,
        cached_prompt_tokens=cached,
        token_source="usage",
        session=idx % 2,
        turn=turn,
        event_t_ns=np.array([10 * ms, 30 * ms], np.int64),
        event_bytes=np.array([10, 10], np.int32),
        event_kind=np.array([0, 0], np.int8),
        event_tokens=np.array([1, 2], np.int32),
    )


RECS = [
    _rec(0, 1, 100, 0),
    _rec(1, 1, 60, None),  # did not say: out of the mean and the share
    _rec(2, 1, 80, 999, ok=False),  # failed: out too
    _rec(3, 2, 200, 150),
    _rec(4, 2, 120, 90),
    _rec(5, 3, 50, None),  # no request of turn 3 said
]


def _check_turns(table: list[dict[str, Any]]) -> None:
    t = {r["turn"]: r for r in table}
    assert t[1]["cached_prompt_tokens"]["n"] == 1 and t[1]["cached_prompt_tokens"]["mean"] == 0.0
    assert t[1]["cached_share"] == 0.0  # 0 / 100
    assert t[2]["cached_prompt_tokens"]["mean"] == pytest.approx(120.0)
    assert t[2]["cached_share"] == pytest.approx((150 + 90) / (200 + 120))
    assert (t[2]["cached_tokens_sum"], t[2]["cache_prompt_tokens_sum"]) == (240, 320)
    assert t[3]["cached_prompt_tokens"]["n"] == 0 and t[3]["cached_share"] is None
    run = responses_prefix_cache(table)
    assert run is not None and run["source"] == "responses" and run["requests"] == 3
    assert run["hit_ratio"] == pytest.approx(240 / 420)
    assert "57.1% of 420 prompt tokens were served from the cache" in prefix_cache_line(run)


def test_per_turn_cached_share_against_a_hand_computation() -> None:
    table = turn_table(RECS)
    _check_turns(table)
    flat = flat_rows(table)
    assert "cached_share" in csv_columns() and "cached_prompt_tokens_mean" in csv_columns()
    assert [r["cached_share"] for r in flat] == [0.0, pytest.approx(0.75), None]
    assert responses_prefix_cache(turn_table(RECS[5:])) is None  # nobody said


def test_stored_round_trip_and_the_table_from_rows_on_sqlite_and_postgres(db_url: str) -> None:
    spec = RunSpec(
        base_url="http://h:1", model="m", dataset="jsonl", dataset_path="/c.jsonl",
        multi_turn=True, endpoint="chat",
    )  # fmt: skip
    sessions = open_database(db_url)
    big = _rec(6, 3, 2**40, 2**40 - 1)  # past 32 bits: BIGINT on PostgreSQL
    recs = [*RECS, big]
    with session_scope(sessions) as s:
        run_id = repo.create_run(s, spec, status=RunStatus.SUCCEEDED)
        from app.analysis.metrics import per_request_metrics

        repo.insert_requests(s, run_id, recs, per_request_metrics(trace_from_records(recs)))
    with session_scope(sessions) as s:
        loaded = repo.load_records(s, run_id)
        rows = browse.request_rows(s, run_id, limit=100, offset=0)
        table = run_turns.turn_table_of_run(s, run_id, run_dict(repo.get_run(s, run_id)))
    want = [r.cached_prompt_tokens for r in recs]
    assert [r.cached_prompt_tokens for r in loaded] == want
    assert [r["cached_prompt_tokens"] for r in rows] == want
    assert table is not None and table == turn_table(recs)
    assert [r["cached_share"] for r in table][:2] == [0.0, pytest.approx(0.75)]


def test_exports_and_pages_show_the_count(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from tests.web_support import web_app

    url = f"sqlite:///{tmp_path / 'c.db'}"
    sessions = open_database(url)
    spec = RunSpec(
        base_url="http://h:1", model="m", dataset="jsonl", dataset_path="/c.jsonl",
        multi_turn=True, endpoint="chat",
    )  # fmt: skip
    from app.analysis.metrics import per_request_metrics

    with session_scope(sessions) as s:
        run_id = repo.create_run(s, spec, status=RunStatus.SUCCEEDED)
        repo.insert_requests(s, run_id, RECS, per_request_metrics(trace_from_records(RECS)))
    want = [r.cached_prompt_tokens for r in RECS]
    with TestClient(web_app(url)) as c:
        got = list(csv.DictReader(io.StringIO(c.get(f"/runs/{run_id}/requests.csv").text)))
        assert [
            int(r["cached_prompt_tokens"]) if r["cached_prompt_tokens"] else None for r in got
        ] == want
        objs = [json.loads(x) for x in c.get(f"/runs/{run_id}/requests.jsonl").text.splitlines()]
        assert [o["cached_prompt_tokens"] for o in objs] == want
        table = pq.read_table(io.BytesIO(c.get(f"/runs/{run_id}/requests.parquet").content))
        assert table.to_pydict()["cached_prompt_tokens"] == want
        api = c.get(f"/api/v1/runs/{run_id}/requests?limit=100").json()["items"]
        assert [r["cached_prompt_tokens"] for r in api] == want
        turns = list(csv.DictReader(io.StringIO(c.get(f"/runs/{run_id}/turns.csv").text)))
        assert [r["cached_share"] for r in turns] == ["0.0", "0.75", ""]
        assert turns[1]["cached_prompt_tokens_mean"] == "120.0"
        page = c.get(f"/runs/{run_id}")
        assert page.status_code == 200, page.text[:300]
        assert "57.1% of 420 prompt tokens were served from the cache (240;" in page.text
        assert "the server's /metrics has no prefix-cache counters" in page.text
        row2 = page.text[page.text.index('<tr data-turn="2">') :]
        row2 = row2[: row2.index("</tr>")]
        assert '<td class="num">120.0</td>' in row2 and '<td class="num">75.0%</td>' in row2
        one = c.get(f"/runs/{run_id}/requests/3").text
        assert "150 prompt tokens from the server's prefix cache" in one
        none = c.get(f"/runs/{run_id}/requests/1").text
        assert 'id="cached-prompt-tokens"' not in none


def test_cli_report_per_turn_columns_and_the_responses_line() -> None:
    from rich.console import Console

    from app.cli.render import render_report

    console = Console(record=True, width=400, color_system=None)
    table = turn_table(RECS)
    report: dict[str, Any] = {
        "metrics": {"requests": {"sent": 6, "completed_ok": 5}},
        "validity": {},
        "turns": table,
        "load": {"server_metrics": {"status": "ok"}},  # no prefix-cache counters
    }
    render_report(report, console)
    out = console.export_text()
    assert "cached prompt tokens mean" in out and "cached share" in out
    assert "75.0%" in out and "120.0" in out
    assert "server prefix cache: 57.1% of 420 prompt tokens were served from the cache" in out
    assert "3 successful requests' responses" in out
    report["load"]["server_metrics"]["prefix_cache"] = {
        "source": "vllm", "queried_tokens": 400.0, "hit_tokens": 240.0, "hit_ratio": 0.6,
    }  # fmt: skip
    console = Console(record=True, width=400, color_system=None)
    render_report(report, console)
    out = console.export_text()
    assert "60.0% of 400 queried prompt tokens were hits (vllm counters" in out
    assert "served from the cache" not in out


def test_a_single_turn_runs_cached_share_on_its_page_report_and_cli(tmp_path: Path) -> None:
    """A prefix workload is single-turn: its run still shows the share its responses
    reported, on the run page (one SQL sum), in the load statistics and the CLI report."""
    from rich.console import Console

    from app.analysis.metrics import per_request_metrics
    from app.analysis.prefix_cache import records_prefix_cache
    from app.cli.render import render_report
    from tests.web_support import web_app

    recs = [_rec(i, 1, inp, c, ok=ok) for i, (inp, c, ok) in enumerate(
        [(512, 0, True), (512, 448, True), (520, 448, True), (512, None, True), (512, 500, False)]
    )]  # fmt: skip
    for r in recs:
        r.session = r.turn = None  # single requests
    warm = _rec(9, 1, 512, 512)
    warm.session = warm.turn = None
    warm.warmup = True  # a warm-up is not measured
    share = records_prefix_cache([*recs, warm])
    assert share is not None and share["requests"] == 3  # the None and the failed are out
    assert (share["hit_tokens"], share["queried_tokens"]) == (896, 1544)  # 0+448+448, 512*2+520
    from app.client import execute

    assert execute._cached([*recs, warm]) == {"prefix_cache_responses": share}  # load_stats
    assert execute._cached([recs[3]]) == {}  # no response said: nothing stored
    url = f"sqlite:///{tmp_path / 'one.db'}"
    sessions = open_database(url)
    spec = RunSpec(base_url="http://h:1", model="m", dataset="prefix_repetition",
                   dataset_options={"num_prefixes": 1})  # fmt: skip
    with session_scope(sessions) as s:
        run_id = repo.create_run(s, spec, status=RunStatus.SUCCEEDED)
        all_recs = [*recs, warm]
        pm = per_request_metrics(trace_from_records(all_recs, include_warmup=True))
        repo.insert_requests(s, run_id, all_recs, pm)
    with TestClient(web_app(url)) as c:
        page = c.get(f"/runs/{run_id}").text
    assert 'id="prefix-cache-run"' in page and 'id="turns"' not in page
    assert "58.0% of 1,544 prompt tokens were served from the cache (896;" in page
    console = Console(record=True, width=400, color_system=None)
    render_report(
        {"metrics": {"requests": {"sent": 5, "completed_ok": 4}}, "validity": {},
         "load": {"prefix_cache_responses": share}}, console,
    )  # fmt: skip
    assert "58.0% of 1544 prompt tokens were served from the cache" in console.export_text()
