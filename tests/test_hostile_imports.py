"""Hostile import files are rejected whole with ``ImportFormatError`` naming the problem (never
another exception), and nothing is written: truncated, huge, wrongly typed, deeply nested,
NaN and infinities, negative times, times out of order.

CSV goes through the import service against a real database; the vLLM, GuideLLM and AIPerf
parsers (pure functions; their services are still being wired) are checked directly."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from app.importers.csv_log import ImportFormatError, parse_csv_log
from app.services import file_imports
from app.services.runs import open_database
from app.storage.models import Request, Run

FIXTURES = Path(__file__).parent / "fixtures" / "interop"
DEEP = "[" * 100_000 + "]" * 100_000
HEADER = "request_id,start_ts,first_token_ts,end_ts,input_tokens,output_tokens\n"
GOOD_CSV = HEADER + "a,100.0,100.05,100.5,10,20\nb,100.1,100.2,100.9,12,30\n"


def _rejected(parse: Callable[[str], Any], text: str, match: str | None = None) -> str:
    with pytest.raises(ImportFormatError) as e:
        parse(text)
    if match is not None:
        assert match in str(e.value), str(e.value)
    return str(e.value)


# ------------------------------------------------------------------------------- CSV

CSV_CASES = {
    "truncated mid-row": (GOOD_CSV[: GOOD_CSV.index("b,100.1") + 12], "row 2"),
    "header only": (HEADER, "no data rows"),
    "missing column": ("request_id,start_ts\nx,1\n", "missing column"),
    "NaN": (HEADER + "a,nan,100.05,100.5,10,20\n", "finite"),
    "infinity": (HEADER + "a,100,inf,100.5,10,20\n", "finite"),
    "negative ttft": (HEADER + "a,100.0,99.0,100.5,10,20\n", "first_token_ts < start_ts"),
    "end before first token": (HEADER + "a,100.0,100.2,100.1,10,20\n", "end_ts < first"),
    "negative start": (HEADER + "a,-5.0,100.2,100.5,10,20\n", "start_ts"),
    "negative input tokens": (HEADER + "a,100,100.1,100.5,-3,20\n", "input_tokens"),
    "string number": (HEADER + "a,100,soon,100.5,10,20\n", "first_token_ts must be a number"),
    "float token count": (HEADER + "a,100,100.1,100.5,10,2.5\n", "must be an integer"),
    "huge token count": (HEADER + "a,100,100.1,100.5,10,99999999999999\n", "output_tokens"),
    "huge time": (HEADER + "a,100,100.1,1e300,10,20\n", "end_ts"),
    "duplicate id": (GOOD_CSV + "a,101,101.1,101.5,1,2\n", "duplicate"),
}


@pytest.mark.parametrize("case", list(CSV_CASES), ids=list(CSV_CASES))
def test_csv_parser_rejects(case: str) -> None:
    text, match = CSV_CASES[case]
    _rejected(parse_csv_log, text, match)


def _counts(db_url: str) -> tuple[int, int]:
    sessions = open_database(db_url)
    try:
        with sessions() as s:
            runs = s.scalar(select(func.count()).select_from(Run)) or 0
            reqs = s.scalar(select(func.count()).select_from(Request)) or 0
            return int(runs), int(reqs)
    finally:
        bind = sessions.kw.get("bind")
        if bind is not None:
            bind.dispose()


def test_csv_import_is_all_or_nothing(sqlite_url: str, tmp_path: Path) -> None:
    sessions = open_database(sqlite_url)
    good_rows = "".join(f"r{i},{100 + i},{100.05 + i},{100.5 + i},10,20\n" for i in range(500))
    bad = tmp_path / "bad.csv"
    bad.write_text(HEADER + good_rows + "bad,1,0.5,2,10,20\n")  # the very last row is wrong
    with pytest.raises(ImportFormatError, match="row 501"):
        file_imports.import_path(sessions, "csv", bad)[0]
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe\x00garbage\x00" * 100)
    with pytest.raises(ImportFormatError):
        file_imports.import_path(sessions, "csv", binary)[0]
    assert _counts(sqlite_url) == (0, 0)
    good = tmp_path / "good.csv"
    good.write_text(GOOD_CSV)
    file_imports.import_path(sessions, "csv", good)[0]  # the same path works for a sound file
    assert _counts(sqlite_url) == (1, 2)


def test_csv_import_has_a_size_cap(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKENTRACE_MAX_IMPORT_BYTES", "10000")  # the one limit, from settings
    big = tmp_path / "big.csv"
    big.write_text(HEADER + "".join(f"r{i},{i},{i + 0.1},{i + 0.5},1,2\n" for i in range(1000)))
    assert big.stat().st_size > 10_000
    with pytest.raises(ImportFormatError, match="larger than"):
        file_imports.import_path(open_database(sqlite_url), "csv", big)[0]
    assert _counts(sqlite_url) == (0, 0)


# --------------------------------------------------------------------- other formats


def _vllm_doc() -> dict[str, Any]:
    return {
        "duration": 2.0,
        "completed": 2,
        "num_prompts": 2,
        "model_id": "m",
        "input_lens": [10, 12],
        "output_lens": [3, 3],
        "ttfts": [0.05, 0.06],
        "itls": [[0.01, 0.01], [0.01, 0.02]],
        "start_times": [0.0, 0.1],
        "errors": ["", ""],
        "mean_ttft_ms": 55.0,
    }


def _vllm_mutations() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, key, value in [
        ("negative ttft", "ttfts", [-0.05, 0.06]),
        ("negative itl", "itls", [[0.01, -0.01], [0.01, 0.02]]),
        ("string ttft", "ttfts", ["fast", 0.06]),
        ("nested itls", "itls", [[[0.01]], [0.01]]),
        ("lengths differ", "output_lens", [3]),
        ("negative duration", "duration", -1),
        ("bool count", "completed", True),
        ("object for list", "ttfts", {"a": 1}),
        ("huge time", "ttfts", [1e300, 0.06]),
    ]:
        doc = copy.deepcopy(_vllm_doc())
        doc[key] = value
        out[name] = doc
    return out


def _vllm(text: str) -> Any:
    from app.importers.vllm_result import parse_vllm_result

    return parse_vllm_result(text)


def _guidellm(text: str) -> Any:
    from app.importers.guidellm_json import parse_guidellm

    return parse_guidellm(text)


def _aiperf(text: str) -> Any:
    from app.importers.aiperf_export import parse_aiperf

    return parse_aiperf(text)


GENERIC = {
    "deep nesting": DEEP,
    "deep nesting in an object": '{"a":' * 50_000 + "1" + "}" * 50_000,
    "NaN literal": '{"duration": NaN, "completed": 1}',
    "Infinity literal": '{"duration": Infinity, "completed": 1}',
    "top-level string": '"hello"',
    "top-level list": "[1, 2, 3]",
    "empty": "",
    "truncated": '{"duration": 2.0, "completed": 2, "ttfts": [0.1, 0.',
}


@pytest.mark.parametrize("parser", [_vllm, _guidellm, _aiperf], ids=["vllm", "guidellm", "aiperf"])
@pytest.mark.parametrize("case", list(GENERIC), ids=list(GENERIC))
def test_json_importers_reject_hostile_documents(parser: Callable[[str], Any], case: str) -> None:
    _rejected(parser, GENERIC[case])


def test_vllm_sound_document_parses_and_each_mutation_is_rejected() -> None:
    runs = _vllm(json.dumps(_vllm_doc()))
    assert len(runs) == 1 and len(runs[0].records) == 2
    for name, doc in _vllm_mutations().items():
        msg = _rejected(_vllm, json.dumps(doc))
        assert "result" in msg or "out of range" in msg, (name, msg)  # names where or what


def test_guidellm_truncated_and_mutated_fixture_is_rejected() -> None:
    text = (FIXTURES / "guidellm-benchmarks.json").read_text()
    assert _guidellm(text)  # the fixture itself imports
    _rejected(_guidellm, text[: len(text) // 2])
    doc = json.loads(text)
    timings = doc["benchmarks"][0]["requests"]["successful"][0]["info"]["timings"]
    for key, value in [("request_start", "yesterday"), ("request_end", [1])]:
        bad = copy.deepcopy(doc)
        bad["benchmarks"][0]["requests"]["successful"][0]["info"]["timings"][key] = value
        _rejected(_guidellm, json.dumps(bad), key)
    assert timings  # the mutated path exists in the fixture


def test_aiperf_truncated_and_mutated_records_are_rejected() -> None:
    text = (FIXTURES / "aiperf" / "profile_export.jsonl").read_text()
    assert _aiperf(text).records  # the fixture itself imports
    lines = text.splitlines()
    _rejected(_aiperf, "\n".join([*lines[:-1], lines[-1][: len(lines[-1]) // 2]]), "line")
    first = json.loads(lines[0])
    for path, value in [
        (("metrics", "time_to_first_token", "value"), -5.0),
        (("metrics", "time_to_first_token", "value"), "soon"),
        (("metadata", "request_start_ns"), "now"),
        (("metadata", "request_start_ns"), 1.5),
    ]:
        bad = copy.deepcopy(first)
        node = bad
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        _rejected(_aiperf, "\n".join([json.dumps(bad), *lines[1:]]), path[-2])


def test_the_import_limit_is_one_setting_for_cli_and_api(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TOKENTRACE_MAX_IMPORT_BYTES bounds the CLI's file and the API's upload alike."""
    from tests.api_support import api_client

    body = HEADER + "".join(f"r{i},{i},{i + 0.1},{i + 0.5},1,2\n" for i in range(1000))
    big = tmp_path / "big.csv"
    big.write_text(body)
    monkeypatch.setenv("TOKENTRACE_MAX_IMPORT_BYTES", str(len(body) - 1))
    with pytest.raises(ImportFormatError, match=f"{len(body) - 1}-byte import limit"):
        file_imports.import_path(open_database(sqlite_url), "csv", big)[0]
    with api_client(sqlite_url, max_import_bytes=len(body) - 1) as api:
        r = api.client.post(
            "/api/v1/imports",
            data={"format": "csv"},
            files={"file": ("big.csv", body.encode())},
            headers=api.h(api.run),
        )
        assert r.status_code in (413, 422) and str(len(body) - 1) in r.text
