"""The streamed vLLM import (issue 14 item 5): a file read with ijson and stored a batch of
requests at a time stores what reading it whole stores, checked against times computed by
hand from the file's arrays; a bad file stores nothing (SQLite and PostgreSQL) and fails
with the message the whole-file reader gives."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from app.domain import RequestStatus
from app.importers.common import ImportFormatError
from app.importers.vllm_result import parse_vllm_result
from app.services import file_imports
from app.services.file_imports import import_path, store_imported
from app.services.imports import read_import_text
from app.services.runs import open_database
from app.storage import repository as repo
from app.storage.db import session_scope
from app.storage.models import Request, Run
from app.storage.models_interop import RunImport

N = 2300  # more than two batches of 1,000


def detailed_object(n: int, seed: int, *, start_times: bool = True, **extra: Any) -> dict[str, Any]:
    """A ``--save-detailed`` result of ``n`` requests: some failed (an error, or no first
    token), some with more output tokens than chunks, whole-number gaps among the floats."""
    rng = random.Random(seed)
    itls: list[list[float | int]] = []
    errors, ttfts, outs = [], [], []
    for i in range(n):
        gaps: list[float | int] = [round(rng.uniform(0.001, 0.05), 6) for _ in range(i % 7)]
        if i % 11 == 0 and gaps:
            gaps[0] = 0 if i % 2 else 1  # an int, as json writes 0 and 1
        itls.append(gaps)
        failed = i % 97 == 5
        errors.append("ReadTimeout: no data" if failed else "")
        ttfts.append(0.0 if i % 131 == 7 else round(rng.uniform(0.02, 0.3), 6))
        outs.append(len(gaps) + 1 + (3 if i % 13 == 0 else 0))
    obj: dict[str, Any] = {
        "date": "20261201-120000",
        "backend": "vllm",
        "model_id": "m/x",
        "num_prompts": n,
        "request_rate": 4.0,
        "max_concurrency": 16,
        "duration": 12.5,
        "completed": n,
        "failed": 0,
        "mean_ttft_ms": 120.0,
        "median_ttft_ms": 110.0,
        "p99_ttft_ms": 290.0,
        "p99.9_itl_ms": 49.0,
        "request_throughput": 3.9,
        "input_lens": [10 + i % 50 for i in range(n)],
        "output_lens": outs,
        "ttfts": ttfts,
        "itls": itls,
        "generated_texts": ["x" * (i % 5) for i in range(n)],
        "errors": errors,
        "extra_info": {"nested": [[1, 2], {"a": None}]},
    }
    if start_times:
        obj["start_times"] = [1_700_000_000.0 + i * 0.013 + rng.uniform(0, 0.01) for i in range(n)]
    obj.update(extra)
    return obj


def _no_whole_file_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the fallback fail loudly: the test is about the streamed path."""

    def refuse(text: str, *, name: str = "vllm") -> Any:
        raise AssertionError("the file was read whole, not streamed")

    monkeypatch.setattr(file_imports, "parse_vllm_result", refuse)


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def test_streamed_import_stores_the_times_computed_by_hand(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    obj = detailed_object(N, seed=1)
    path = tmp_path / "result.json"
    path.write_text(json.dumps(obj))
    _no_whole_file_reader(monkeypatch)
    sessions = open_database(db_url)
    (run_id,) = import_path(sessions, "vllm", path)
    with session_scope(sessions) as s:
        records = repo.load_records(s, run_id)
        stored = {
            row.idx: row for row in s.scalars(select(Request).where(Request.run_id == run_id)).all()
        }
    assert len(records) == N
    origin = min(obj["start_times"])
    checked_ok = 0
    for i, r in enumerate(records):
        assert r.index == i
        sent = _ns(obj["start_times"][i] - origin)
        assert r.sent_ns == sent and r.input_tokens == obj["input_lens"][i]
        if obj["errors"][i] or obj["ttfts"][i] <= 0:
            assert r.status is RequestStatus.ERROR
            assert r.error == (obj["errors"][i] or "failed (no first token)")
            assert r.event_t_ns.size == 0
            continue
        t = sent + _ns(obj["ttfts"][i])  # the first chunk at start + ttft ...
        expected = [t]
        for gap in obj["itls"][i]:  # ... the next ones the file's itls apart
            t += _ns(gap)
            expected.append(t)
        assert r.status is RequestStatus.OK
        assert r.event_t_ns.tolist() == expected, i
        assert r.event_tokens.tolist() == [1] * len(expected)
        assert r.output_tokens == obj["output_lens"][i]
        assert r.end_ns == expected[-1]
        row = stored[i]
        assert row.ttft_ns == expected[0] - sent and row.e2e_ns == expected[-1] - sent
        checked_ok += 1
    assert checked_ok > N * 0.9
    with session_scope(sessions) as s:
        run = repo.get_run(s, run_id)
        assert run.name == "result.json" and run.source == "import:vllm"
        more = sum(1 for i in range(N) if i % 13 == 0 and not obj["errors"][i] and obj["ttfts"][i])
        assert f"{more} requests have more output tokens than chunks" in " ".join(run.validity)


def _rows(sessions: Any, run_ids: list[str]) -> list[dict[str, Any]]:
    """Everything stored for the runs, bar ids, the import group and creation times."""
    out = []
    with session_scope(sessions) as s:
        for run_id in run_ids:
            run = s.get(Run, run_id)
            assert run is not None
            cols = {c.name: getattr(run, c.key) for c in Run.__table__.columns}
            for key in ("id", "created_at", "started_at", "finished_at", "updated_at"):
                cols.pop(key, None)
            cols["tags"] = sorted(t for t in run.tags if not t.startswith("import-group:"))
            imp = s.scalar(select(RunImport).where(RunImport.run_id == run_id))
            assert imp is not None
            cols["import"] = {
                c.name: getattr(imp, c.key)
                for c in RunImport.__table__.columns
                if c.name not in ("id", "run_id", "group_id", "created_at")
            }
            reqs = s.scalars(
                select(Request).where(Request.run_id == run_id).order_by(Request.idx)
            ).all()
            cols["requests"] = [
                {c.name: getattr(r, c.key) for c in Request.__table__.columns if c.name != "id"}
                | {"run_id": None}
                for r in reqs
            ]
            out.append(cols)
    return out


def test_streamed_and_whole_file_imports_store_the_same(sqlite_url: str, tmp_path: Path) -> None:
    """An --append-result file: a detailed object, one without start_times, a summary."""
    summary = {k: v for k, v in detailed_object(3, seed=9).items() if k not in (
        "input_lens", "output_lens", "ttfts", "itls", "errors", "start_times")}  # fmt: skip
    text = "\n".join(
        json.dumps(o)
        for o in (
            detailed_object(N, seed=2, request_rate="inf"),
            detailed_object(40, seed=3, start_times=False),
            summary,
        )
    )
    path = tmp_path / "sweep.json"
    path.write_text(text)
    sessions = open_database(sqlite_url)
    streamed = import_path(sessions, "vllm", path)
    whole = store_imported(
        sessions, parse_vllm_result(text, name="sweep.json"), file_name=path.name
    )
    assert len(streamed) == 3
    a, b = _rows(sessions, streamed), _rows(sessions, whole)
    assert [len(x["requests"]) for x in a] == [N, 40, 0]
    assert a[0]["name"] == "sweep.json #1 (vllm, rate inf, concurrency 16)"
    assert a == b


def _counts(sessions: Any) -> tuple[int, int]:
    with session_scope(sessions) as s:
        runs = s.scalar(select(func.count()).select_from(Run)) or 0
        reqs = s.scalar(select(func.count()).select_from(Request)) or 0
    return int(runs), int(reqs)


def test_an_error_after_stored_batches_leaves_nothing(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = detailed_object(N, seed=4)
    k = next(i for i in range(1500, N) if bad["itls"][i] and not bad["errors"][i])
    bad["itls"][k][0] = -0.25
    text = json.dumps(detailed_object(N, seed=5)) + "\n" + json.dumps(bad)
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ImportFormatError) as expected:
        parse_vllm_result(text)
    assert f"object 2 request {k}: itls[0]: must be >= 0" in str(expected.value)
    _no_whole_file_reader(monkeypatch)  # the streamed path itself reports it
    sessions = open_database(db_url)
    with pytest.raises(ImportFormatError) as got:
        import_path(sessions, "vllm", path)
    assert str(got.value) == str(expected.value)
    assert _counts(sessions) == (0, 0)


def _mean_ttft_huge() -> bytes:
    return (
        json.dumps(detailed_object(30, seed=6))[:-1].encode()
        + b', "mean_tpot_ms": '
        + (b"9" * 4001)
        + b"}"
    )


def _first_chunk_too_late() -> bytes:
    obj = detailed_object(30, seed=6)
    obj["start_times"][29] = min(obj["start_times"]) + 9.1e9
    obj["ttfts"][29] = 9.1e9
    obj["errors"][29] = ""
    return json.dumps(obj).encode()


# Files the streamed reader refuses or must not judge alone: the message is the whole-file
# reader's (an earlier object's error loses to a later syntax error or a later bad byte,
# as when the file is read whole first)
HOSTILE: dict[str, bytes] = {
    "bad request, then a syntax error": (
        json.dumps(detailed_object(30, seed=7, ttfts=["x"] * 30)) + '\n{"duration": 1,,}'
    ).encode(),
    "bad request, then a bad byte": (
        json.dumps(detailed_object(30, seed=7, ttfts=["x"] * 30)).encode() + b"\n\xff"
    ),
    "a 4001-digit number": _mean_ttft_huge(),
    "an integer over 64 bits": json.dumps(
        detailed_object(30, seed=6, input_lens=[2**70] * 30)
    ).encode(),
    "a string among the itls": json.dumps(
        detailed_object(30, seed=6, itls=[["soon"]] + [[]] * 29)
    ).encode(),
    "a negative whole-number itl": json.dumps(
        detailed_object(30, seed=6, itls=[[0.1, -2]] + [[]] * 29)
    ).encode(),
    "a bad request_rate and a bad request": json.dumps(
        detailed_object(30, seed=6, request_rate="fast", output_lens=[1e12] * 30)
    ).encode(),
    "a bad request_rate alone": json.dumps(
        detailed_object(30, seed=6, request_rate="fast")
    ).encode(),
    "deep nesting in a key the run does not use": (
        b'{"duration": 1, "completed": 1, "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    ),
    "deep nesting in a kept key": (
        b'{"duration": 1, "completed": 1, "label": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    ),
    "a first chunk past int64 nanoseconds": _first_chunk_too_late(),
    "chunk times past int64 nanoseconds": json.dumps(
        detailed_object(30, seed=6, itls=[[9.1e9, 9.1e9]] + [[]] * 29)
    ).encode(),
    "top-level list": b"[1, 2]",
    "empty": b"  \n",
    "truncated": json.dumps(detailed_object(30, seed=6)).encode()[:-40],
}


@pytest.mark.parametrize("case", list(HOSTILE), ids=list(HOSTILE))
def test_bad_files_fail_with_the_whole_file_message(
    case: str, sqlite_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(HOSTILE[case])
    with pytest.raises(ImportFormatError) as expected:
        parse_vllm_result(read_import_text(path))
    sessions = open_database(sqlite_url)
    with pytest.raises(ImportFormatError) as got:
        import_path(sessions, "vllm", path)
    assert str(got.value) == str(expected.value)
    assert _counts(sessions) == (0, 0)


# Files the streamed reader refuses that are sound for the whole-file reader: imported whole
SOUND: dict[str, bytes] = {
    "NaN in a key the run does not use": json.dumps(detailed_object(30, seed=8))[:-1].encode()
    + b', "burstiness_seen": NaN}',
    "a question mark in an error": json.dumps(
        detailed_object(30, seed=8, errors=["timeout?"] + [""] * 29)
    ).encode(),
    "a failed request's itls not numbers": json.dumps(
        detailed_object(30, seed=8, errors=["E"] + [""] * 29, itls=[["?"]] + [[0.1]] * 29)
    ).encode(),
}


@pytest.mark.parametrize("case", list(SOUND), ids=list(SOUND))
def test_files_the_stream_refuses_are_imported_whole(
    case: str, sqlite_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(SOUND[case])
    sessions = open_database(sqlite_url)
    ids = import_path(sessions, "vllm", path)
    text = read_import_text(path)
    whole = store_imported(sessions, parse_vllm_result(text, name="f.json"), file_name="f.json")
    assert _rows(sessions, ids) == _rows(sessions, whole)
    assert _counts(sessions) == (2, 60)


def test_the_import_limit_applies_before_streaming(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "big.json"
    path.write_text(json.dumps(detailed_object(30, seed=8)))
    monkeypatch.setenv("TOKENTRACE_MAX_IMPORT_BYTES", str(path.stat().st_size - 1))
    sessions = open_database(sqlite_url)
    with pytest.raises(ImportFormatError, match=f"{path.stat().st_size - 1}-byte import limit"):
        import_path(sessions, "vllm", path)
    assert _counts(sessions) == (0, 0)
