"""Imports are bounded by events and by concurrency, the limit named in the answer: a file
over ``max_import_events`` is refused whole (413) as it is read (a vLLM file's gaps past
the limit are never kept) and nothing is stored; while ``max_concurrent_imports`` imports
run another gets 429. A vLLM upload is read as a stream from the spooled upload."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from app.importers.common import ImportTooLarge
from app.services import file_imports
from app.services.runs import open_database
from app.storage.models import Request, Run
from tests.api_support import Api, api_client
from tests.test_vllm_stream_import import detailed_object
from tests.web_support import post_form, sign_in

FIXTURES = Path(__file__).parent / "fixtures" / "interop"


def _counts(sessions: sessionmaker[Session]) -> tuple[int, int]:
    with sessions() as s:
        runs = s.scalar(select(func.count()).select_from(Run)) or 0
        reqs = s.scalar(select(func.count()).select_from(Request)) or 0
    return int(runs), int(reqs)


def _events(obj: dict[str, Any]) -> int:
    """Events of a detailed vLLM object: each request's chunks (its gaps + 1), failed
    requests (an error, or no first token) none."""
    return sum(
        len(gaps) + 1
        for gaps, err, ttft in zip(obj["itls"], obj["errors"], obj["ttfts"], strict=True)
        if not err and ttft > 0
    )


def _zero_gap_file(n_requests: int, gaps: int, tail: str = "") -> bytes:
    """The issue's file: every gap written as ``0`` (2 bytes an event)."""
    obj = detailed_object(n_requests, seed=4)
    obj["itls"] = [[0] * gaps for _ in range(n_requests)]
    obj["output_lens"] = [gaps + 1] * n_requests
    return (json.dumps(obj) + tail).encode()


def test_a_vllm_file_over_the_event_limit_is_refused_as_it_is_read(
    db_url: str, tmp_path: Path
) -> None:
    sessions = open_database(db_url)
    obj = detailed_object(2300, seed=8)
    path = tmp_path / "f.json"
    path.write_text(json.dumps(obj))
    n = _events(obj)
    with pytest.raises(ImportTooLarge, match=f"more than {n - 1:,} events.*MAX_IMPORT_EVENTS"):
        file_imports.import_vllm_file(sessions, path.open("rb"), file_name="f", max_events=n - 1)
    assert _counts(sessions) == (0, 0)
    ids = file_imports.import_vllm_file(sessions, path.open("rb"), file_name="f", max_events=n)
    assert ids is not None and _counts(sessions) == (1, 2300)  # exactly at the limit: stored


def test_the_gaps_past_the_limit_are_never_kept(tmp_path: Path, sqlite_url: str) -> None:
    """2,000,000 zero gaps (a 4 MB file, 16 MB as floats) under a limit of 1,000 events:
    the reader stops at the limit, holding kilobytes; the rest of the file (here a syntax
    error that a drain or the whole-file reader would report instead) is not read."""
    path = tmp_path / "zeros.json"
    path.write_bytes(_zero_gap_file(2, 1_000_000, tail=" this is not json"))
    sessions = open_database(sqlite_url)
    tracemalloc.start()
    try:
        with pytest.raises(ImportTooLarge, match="1,000 events"), path.open("rb") as f:
            file_imports.import_vllm_file(sessions, f, file_name="z", max_events=1000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4_000_000, peak  # the 2M gaps as floats would be 16 MB
    assert _counts(sessions) == (0, 0)


def test_parsed_formats_over_the_event_limit_store_nothing(db_url: str) -> None:
    sessions = open_database(db_url)
    text = (FIXTURES / "guidellm-benchmarks.json").read_text()
    runs = file_imports.parse_file("guidellm", text, name="g")
    n = sum(int(r.event_t_ns.shape[0]) for run in runs for r in run.records)
    with pytest.raises(ImportTooLarge, match=f"more than {n - 1:,} events"):
        file_imports.import_text(sessions, "guidellm", text, file_name="g", max_events=n - 1)
    assert _counts(sessions) == (0, 0)
    assert file_imports.import_text(sessions, "guidellm", text, file_name="g", max_events=n)


def _upload(api: Api, body: bytes, fmt: str = "vllm") -> Any:
    return api.client.post(
        "/api/v1/imports",
        data={"format": fmt},
        files={"file": ("f.json", body)},
        headers=api.h(api.run),
    )


def test_the_api_names_the_event_limit_and_stores_nothing(sqlite_url: str) -> None:
    body = _zero_gap_file(3, 500)  # 1,503 events
    with api_client(sqlite_url, max_import_events=1000) as api:
        r = _upload(api, body)
        assert r.status_code == 413, r.text
        detail = r.json()["detail"][0]
        assert detail["loc"] == ["body", "file"]
        assert "1,000 events" in detail["msg"] and "TOKENTRACE_MAX_IMPORT_EVENTS" in detail["msg"]
        assert _counts(api.sessions) == (0, 0)
    with api_client(sqlite_url, max_import_events=1503) as api:
        r = _upload(api, body)
        assert r.status_code == 201, r.text
        assert _counts(api.sessions) == (1, 3)


def test_a_second_import_while_one_runs_gets_429(sqlite_url: str) -> None:
    body = json.dumps(detailed_object(40, seed=2)).encode()
    with api_client(sqlite_url) as api:
        slots = api.app.state.import_slots
        assert slots.size == 1 and slots.try_take()  # an import is running
        try:
            r = _upload(api, body)
            assert r.status_code == 429, r.text
            assert "TOKENTRACE_MAX_CONCURRENT_IMPORTS" in r.json()["detail"]
            assert r.headers["retry-after"] == "5"
            assert _counts(api.sessions) == (0, 0)
            sign_in(api.client, api.run)  # the import page says the same
            page = post_form(
                api.client, "/import", {"format": "vllm"}, files={"file": ("f.json", body)}
            )
            assert page.status_code == 429 and "at most 1 at once" in page.text
        finally:
            slots.give()
        r = _upload(api, body)
        assert r.status_code == 201, r.text  # the slot is free again
        assert slots.try_take()  # and given back after the import
        slots.give()


def test_a_failed_import_gives_its_slot_back(sqlite_url: str) -> None:
    with api_client(sqlite_url, max_import_events=10) as api:
        for _ in range(3):
            assert _upload(api, _zero_gap_file(3, 500)).status_code == 413
            assert _upload(api, b"{not json").status_code == 422
        assert _upload(api, b"request_id\n", "csv").status_code == 422
        assert api.app.state.import_slots.try_take()
