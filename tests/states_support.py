"""Runs in every situation a verdict tells apart (issue 24 item 9), stored through the real
paths (``store_requests`` + ``finalize_run``, an import, a queued run), and the verdict each
must read, written by hand from the situation (not by the verdict function)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from app.client.spec import RunSpec
from app.domain import EventKind, RequestRecord, RequestStatus, RunStatus
from app.protocol.wire import RunMeta
from app.services.file_imports import import_path
from app.services.runs import finalize_run, store_requests
from app.storage import repository as repo
from app.storage.db import session_scope

MS = 1_000_000
CSV_LOG = """request_id,start_ts,first_token_ts,end_ts,input_tokens,output_tokens
r1,100.000,100.120,100.900,200,50
r2,100.100,100.260,101.300,210,60
r3,100.200,100.350,100.700,190,1
"""


@dataclass(frozen=True)
class Situation:
    key: str
    word: str  # the verdict every surface must show
    banner: str  # "bad": a do-not-trust banner; "warn": a notice; "": none
    valid: bool  # report validity.valid


# situation -> what it must read (hand-written from the rule in docs/metrics.md)
SITUATIONS = (
    Situation("valid", "valid", "", True),
    Situation("all_failed", "failed", "bad", False),
    Situation("over_bound", "over error bound", "bad", False),
    Situation("lost_requests", "incomplete", "bad", False),
    Situation("lost_turns", "lost turns", "bad", False),
    Situation("client_limited", "client-limited", "bad", False),
    Situation("cancelled", "cancelled", "warn", False),
    Situation("summary_only", "summary-only", "", True),
    Situation("queued", "pending", "warn", False),
    Situation("running", "pending", "warn", False),
)


def ok_record(i: int) -> RequestRecord:
    """A successful request sent at i x 50 ms: 3 tokens at +10, +12, +14 ms."""
    t0 = i * 50 * MS
    ev = np.array([t0 + 10 * MS, t0 + 12 * MS, t0 + 14 * MS], np.int64)
    return RequestRecord(
        index=i, scheduled_ns=t0, sent_ns=t0, end_ns=t0 + 15 * MS, status=RequestStatus.OK,
        input_tokens=8, output_tokens=3, token_source="usage",
        event_t_ns=ev, event_bytes=np.full(3, 40, np.int32),
        event_kind=np.full(3, EventKind.CONTENT, np.int8), event_tokens=np.ones(3, np.int32),
    )  # fmt: skip


def cut_record(i: int, status: RequestStatus, error: str) -> RequestRecord:
    """A request sent at i x 50 ms that ended 5 ms later without a token."""
    t0 = i * 50 * MS
    return RequestRecord(
        index=i, scheduled_ns=t0, sent_ns=t0, end_ns=t0 + 5 * MS, status=status, error=error
    )


def _spec(**kw: object) -> RunSpec:
    fields: dict[str, object] = {"base_url": "http://127.0.0.1:9", "model": "m"} | kw
    return RunSpec.model_validate(fields)


def _stored(
    sessions: sessionmaker[Session],
    name: str,
    spec: RunSpec,
    records: list[RequestRecord],
    status: RunStatus,
    *,
    lost: int | None = None,
    client_limited: bool = False,
    notes: list[str] | None = None,
    load: dict[str, object] | None = None,
    finish: bool = True,
) -> str:
    with session_scope(sessions) as s:
        run_id = repo.create_run(s, spec, name=name, status=RunStatus.RUNNING)
        store_requests(s, run_id, records)
    if finish:
        meta = RunMeta(
            started_at=datetime.now(UTC),
            client_limited=client_limited,
            validity=list(notes or []),
            load_stats=dict(load or {}),
        )
        finalize_run(sessions, run_id, status=status, meta=meta, lost_requests=lost)
    return run_id


def seed_situations(sessions: sessionmaker[Session], tmp: Path) -> dict[str, str]:
    """One run per ``SITUATIONS`` key; their ids."""
    oks = [ok_record(i) for i in range(20)]
    out: dict[str, str] = {}
    out["valid"] = _stored(sessions, "valid", _spec(num_prompts=20), oks, RunStatus.SUCCEEDED)
    errors = [cut_record(i, RequestStatus.ERROR, "HTTP 500") for i in range(5)]
    out["all_failed"] = _stored(
        sessions, "all failed", _spec(num_prompts=5), errors, RunStatus.FAILED
    )
    some = oks + [cut_record(20 + i, RequestStatus.ERROR, "HTTP 503") for i in range(4)]
    out["over_bound"] = _stored(  # 4 of 24 failed: 16.7% > 5%
        sessions, "over bound", _spec(num_prompts=24), some, RunStatus.PARTIAL
    )
    out["lost_requests"] = _stored(
        sessions, "lost", _spec(num_prompts=23), oks, RunStatus.PARTIAL, lost=3
    )
    turns = [*oks, cut_record(20, RequestStatus.ERROR, "HTTP 500")]  # 1 of 21: 4.8% < 5%
    multi = _spec(
        num_prompts=10, multi_turn=True, dataset="jsonl", dataset_path=str(tmp / "c.jsonl")
    )
    counts = {"planned": 30, "sent": 21, "ok": 20, "error": 1, "cancelled": 0}
    out["lost_turns"] = _stored(
        sessions, "lost turns", multi, turns, RunStatus.SUCCEEDED,
        load={"counts": counts, "stopped": None},
    )  # fmt: skip
    out["client_limited"] = _stored(
        sessions, "limited", _spec(num_prompts=20), oks, RunStatus.SUCCEEDED,
        client_limited=True, notes=["send lag p99 12.00 ms > 10 ms"],
    )  # fmt: skip
    cut = oks[:16] + [cut_record(16 + i, RequestStatus.CANCELLED, "run stopped by the user")
                      for i in range(4)]  # fmt: skip
    out["cancelled"] = _stored(
        sessions, "cancelled", _spec(num_prompts=100), cut, RunStatus.CANCELLED,
        load={"counts": {"planned": 100, "sent": 20}, "stopped": "stopped"},
    )  # fmt: skip
    f = tmp / "log.csv"
    f.write_text(CSV_LOG)
    out["summary_only"] = import_path(sessions, "csv", f, name="imported")[0]
    with session_scope(sessions) as s:
        out["queued"] = repo.create_run(s, _spec(num_prompts=20), name="queued")
    out["running"] = _stored(
        sessions, "running", _spec(num_prompts=40), oks[:10], RunStatus.RUNNING, finish=False
    )
    return out
