"""Issue 24.5: imports of AIPerf and GuideLLM multi-turn files keep each request's session,
turn and cached prompt tokens, so the run gets its by-turn table; AIPerf failures read as a
reason, never "None".

The files are the real ones those tools wrote (tests/fixtures/interop), given the multi-turn
fields as the tools write them (AIPerf 0.13: ``metadata.session_num``,
``metadata.x_correlation_id``, ``metadata.turn_index`` from 0,
``metrics.usage_prompt_cache_read_tokens``; GuideLLM 0.8.1: ``info.conversation_id``,
``info.turn_index`` from 0, ``input_metrics.cached_tokens`` and the request's computed
``cached_tokens``). Expected tables are computed here from the raw file values with numpy.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from app.domain import RequestStatus
from app.importers.aiperf_export import parse_aiperf
from app.importers.guidellm_json import parse_guidellm
from app.services.file_imports import import_text
from app.services.runs import run_report
from tests.api_support import api_client
from tests.test_interop_import import FIX

# AIPerf: 12 real lines -> 4 sessions of 3 turns; the server's cached prompt tokens by turn
AIPERF_CACHED = (0, 8, 16)


def aiperf_multi_turn() -> tuple[str, list[dict[str, Any]]]:
    lines = [
        json.loads(x) for x in (FIX / "aiperf" / "profile_export.jsonl").read_text().splitlines()
    ]
    for j, obj in enumerate(lines):
        session, turn = divmod(j, 3)
        md = obj["metadata"]
        md["session_num"] = session
        md["x_correlation_id"] = f"corr-{session}"
        md["conversation_id"] = f"conv-{session}"
        md["turn_index"] = turn
        obj["metrics"]["usage_prompt_cache_read_tokens"] = {
            "value": AIPERF_CACHED[turn],
            "unit": "tokens",
        }
    return "\n".join(json.dumps(x) for x in lines) + "\n", lines


def guidellm_multi_turn() -> tuple[str, list[dict[str, Any]]]:
    """Benchmark 0's six requests as two conversations of three turns (request k: turn k % 3
    of conversation k // 3); cached tokens 0, 10, 20 by turn."""
    obj = json.loads((FIX / "guidellm-benchmarks.json").read_text())
    reqs = obj["benchmarks"][0]["requests"]["successful"]
    for k, req in enumerate(reqs):
        conv, turn = divmod(k, 3)
        req["info"]["conversation_id"] = f"conversation-{conv}"
        req["info"]["turn_index"] = turn
        req["input_metrics"]["cached_tokens"] = 10 * turn
        req["cached_tokens"] = 10 * turn
    return json.dumps(obj), reqs


def _p50(values: list[float]) -> float:
    return float(np.percentile(values, 50))


def test_aiperf_multi_turn_records_keep_session_turn_and_cache() -> None:
    text, lines = aiperf_multi_turn()
    run = parse_aiperf(text)
    got = [(r.session, r.turn, r.cached_prompt_tokens) for r in run.records]
    want = [(j // 3, j % 3 + 1, AIPERF_CACHED[j % 3]) for j in range(len(lines))]
    assert got == want
    # a single-turn file (every turn_index 0) stays single-turn; no cache count: None
    single = parse_aiperf((FIX / "aiperf" / "profile_export.jsonl").read_text())
    assert all(r.session is None and r.turn is None for r in single.records)
    assert all(r.cached_prompt_tokens is None for r in single.records)


def test_guidellm_multi_turn_records_keep_session_turn_and_cache() -> None:
    text, _reqs = guidellm_multi_turn()
    first, second = parse_guidellm(text)
    got = [(r.session, r.turn, r.cached_prompt_tokens) for r in first.records]
    assert got == [(k // 3, k % 3 + 1, 10 * (k % 3)) for k in range(6)]
    # benchmark 1 of the same file is single-turn: nothing set
    assert all(r.session is None and r.turn is None for r in second.records)


def test_guidellm_sessions_numbered_in_order_of_their_first_request() -> None:
    """Conversation ids are opaque strings: sessions are numbered 0, 1, ... in the order of
    each conversation's first request start, whatever the file's order."""
    obj = json.loads((FIX / "guidellm-benchmarks.json").read_text())
    reqs = obj["benchmarks"][0]["requests"]["successful"]
    starts = [r["info"]["timings"]["request_start"] for r in reqs]
    assert starts == sorted(starts)
    # requests 0, 2, 4 are "zz" (turns 0, 1, 2), requests 1, 3, 5 are "aa"
    for k, req in enumerate(reqs):
        req["info"]["conversation_id"] = "zz" if k % 2 == 0 else "aa"
        req["info"]["turn_index"] = k // 2
    (run, _) = parse_guidellm(json.dumps(obj))
    assert [(r.session, r.turn) for r in run.records] == [
        (0, 1), (1, 1), (0, 2), (1, 2), (0, 3), (1, 3)
    ]  # fmt: skip


def _turn_rows(report: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(r["turn"]): r for r in report["turns"]}


def test_aiperf_multi_turn_import_has_its_turn_table(db_url: str) -> None:
    text, lines = aiperf_multi_turn()
    with api_client(db_url) as api:
        (run_id,) = import_text(api.sessions, "aiperf", text, file_name="mt.jsonl")
        rows = _turn_rows(run_report(api.sessions, run_id))
        assert sorted(rows) == [1, 2, 3]
        for turn in (1, 2, 3):
            mine = [x for j, x in enumerate(lines) if j % 3 == turn - 1]
            ttft = [x["metrics"]["time_to_first_token"]["value"] for x in mine]
            assert rows[turn]["requests"] == rows[turn]["ok"] == 4
            assert rows[turn]["ttft_ms"]["p50"] == pytest.approx(_p50(ttft), abs=1e-5)
            # cached share over the server's prompt count (usage_prompt_tokens, 21 here)
            prompt = sum(x["metrics"]["usage_prompt_tokens"]["value"] for x in mine)
            cached = 4 * AIPERF_CACHED[turn - 1]
            assert rows[turn]["cached_share"] == pytest.approx(cached / prompt)
        page = api.client.get(f"/runs/{run_id}").text
        assert 'id="turn-table"' in page and 'data-turn="3"' in page
        # the real single-turn file: no table
        single = (FIX / "aiperf" / "profile_export.jsonl").read_text()
        (plain,) = import_text(api.sessions, "aiperf", single, file_name="p.jsonl")
        assert not run_report(api.sessions, plain).get("turns")
        assert 'id="turn-table"' not in api.client.get(f"/runs/{plain}").text


def test_guidellm_multi_turn_import_has_its_turn_table(db_url: str) -> None:
    text, reqs = guidellm_multi_turn()
    with api_client(db_url) as api:
        ids = import_text(api.sessions, "guidellm", text, file_name="g.json")
        rows = _turn_rows(run_report(api.sessions, ids[0]))
        assert sorted(rows) == [1, 2, 3]
        for turn in (1, 2, 3):
            mine = [r for k, r in enumerate(reqs) if k % 3 == turn - 1]
            t = [r["info"]["timings"] for r in mine]
            ttft = [(x["first_token_iteration"] - x["request_start"]) * 1000 for x in t]
            assert rows[turn]["requests"] == 2
            assert rows[turn]["ttft_ms"]["p50"] == pytest.approx(_p50(ttft), abs=1e-5)
            prompt = sum(r["prompt_tokens"] for r in mine)
            assert rows[turn]["cached_share"] == pytest.approx(2 * 10 * (turn - 1) / prompt)
        assert 'id="turn-table"' in api.client.get(f"/runs/{ids[0]}").text
        assert 'id="turn-table"' not in api.client.get(f"/runs/{ids[1]}").text


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        # a transport error: AIPerf has no code for it
        (
            {"code": None, "type": "ClientConnectorError", "message": "Cannot connect to host"},
            "ClientConnectorError: Cannot connect to host",
        ),
        ({"code": 500, "type": "", "message": "boom"}, "HTTP 500: boom"),
        ({"code": 503, "type": None, "message": ""}, "HTTP 503"),
        ({"code": None, "type": "TimeoutError", "message": None}, "TimeoutError"),
        (
            {"code": None, "type": None, "message": ""},
            "error (AIPerf recorded no code, type or message)",
        ),
        ("None", "error (AIPerf recorded no code, type or message)"),
        ("upstream reset", "upstream reset"),
    ],
)
def test_aiperf_failure_reason_is_never_none(error: Any, reason: str) -> None:
    lines = (FIX / "aiperf" / "profile_export.jsonl").read_text().splitlines()
    bad = json.loads(lines[3])
    bad["error"] = error
    bad["metrics"] = {"error_isl": {"value": 32, "unit": "tokens"}}
    run = parse_aiperf("\n".join([*lines[:3], json.dumps(bad), *lines[4:]]))
    rec = run.records[3]
    assert rec.status is RequestStatus.ERROR and rec.error == reason
    assert "None" not in (rec.error or "")


def test_aiperf_transport_failures_summarised_by_their_type() -> None:
    """Every request failed before any HTTP status (AIPerf's code None): the run's failure
    note names the error type, as the report and the page show it."""
    from app.analysis.trust import DEFAULT_MAX_ERROR_RATE, failure_note

    lines = [
        json.loads(x) for x in (FIX / "aiperf" / "profile_export.jsonl").read_text().splitlines()
    ]
    for obj in lines:
        obj["error"] = {"code": None, "type": "ClientConnectorError", "message": "refused"}
        obj["metrics"] = {}
    run = parse_aiperf("\n".join(json.dumps(x) for x in lines))
    note = failure_note(run.records, DEFAULT_MAX_ERROR_RATE)
    assert note is not None and "12 of 12 requests failed" in note
    assert "mostly ClientConnectorError" in note and "None" not in note


def test_hostile_turn_fields_are_refused_naming_the_field() -> None:
    from app.importers.common import ImportFormatError

    _text, lines = aiperf_multi_turn()
    lines[2]["metadata"]["turn_index"] = 2**40
    with pytest.raises(ImportFormatError, match=r"line 3\.metadata\.turn_index: must be <="):
        parse_aiperf("\n".join(json.dumps(x) for x in lines))
    lines[2]["metadata"]["turn_index"] = 2
    lines[4]["metrics"]["usage_prompt_cache_read_tokens"]["value"] = -1
    with pytest.raises(ImportFormatError, match=r"line 5\.metrics\.usage_prompt_cache_read"):
        parse_aiperf("\n".join(json.dumps(x) for x in lines))
    gtext, _ = guidellm_multi_turn()
    obj = json.loads(gtext)
    obj["benchmarks"][0]["requests"]["successful"][1]["info"]["turn_index"] = "two"
    with pytest.raises(ImportFormatError, match=r"successful\[1\]\.info\.turn_index"):
        parse_guidellm(json.dumps(obj))
