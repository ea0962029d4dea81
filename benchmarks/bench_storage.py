"""Storage benchmark: ingest and full load of a large synthetic run on SQLite and PostgreSQL.

    python benchmarks/bench_storage.py [--sqlite] [--postgres] [--requests 10000]
        [--tokens 1000] [--out benchmarks/results/storage.json]

Builds ``requests`` records of ``tokens`` events each (gaps ~10 ms with jitter), then times:
- ingest: pack + insert + commit (``create_run`` + ``insert_requests``);
- load: ``load_trace`` in a fresh session (query + bulk unpack), run twice: the first in the
  process touches fresh memory (page faults), the second reuses it;
- report: ``app.analysis.metrics.compute_metrics`` on the loaded trace, when that exists;
  "full report" = load + compute.
With neither ``--sqlite`` nor ``--postgres`` both run. PostgreSQL uses a throwaway database
created on ``TOKENTRACE_TEST_PG_URL`` (default postgresql+psycopg://postgres@127.0.0.1/test).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import secrets
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app.client.spec import RunSpec
from app.domain import RequestRecord, RequestStatus, RunTrace
from app.storage import repository as repo
from app.storage.db import make_engine, session_factory, session_scope, upgrade_database

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def synthetic_records(n_requests: int, n_tokens: int, seed: int = 0) -> list[RequestRecord]:
    """``n_requests`` successful streams of ``n_tokens`` one-token chunks, ~10 ms apart."""
    rng = np.random.default_rng(seed)
    total = n_requests * n_tokens
    gaps = np.maximum(rng.normal(10e6, 2e6, total), 50_000).astype(np.int64).reshape(n_requests, -1)
    sent = (np.arange(n_requests, dtype=np.int64) * 20_000_000) + rng.integers(0, 1_000, n_requests)
    ttft = rng.integers(50_000_000, 200_000_000, n_requests)
    gaps[:, 0] = ttft
    times = np.cumsum(gaps, axis=1) + sent[:, None]
    nbytes = rng.integers(3, 40, (n_requests, n_tokens)).astype(np.int32)
    kind = np.zeros((n_requests, n_tokens), np.int8)
    tokens = np.ones((n_requests, n_tokens), np.int32)
    return [
        RequestRecord(
            index=i,
            scheduled_ns=int(sent[i]),
            sent_ns=int(sent[i]),
            end_ns=int(times[i, -1]) + 100_000,
            status=RequestStatus.OK,
            http_status=200,
            input_tokens=256,
            output_tokens=n_tokens,
            tokenizer_output_tokens=n_tokens,
            usage_prompt_tokens=256,
            usage_completion_tokens=n_tokens,
            token_source="usage",
            done_ns=int(times[i, -1]) + 200_000,
            event_t_ns=times[i],
            event_bytes=nbytes[i],
            event_kind=kind[i],
            event_tokens=tokens[i],
        )
        for i in range(n_requests)
    ]


def _compute_metrics_hook() -> Callable[[RunTrace], Any] | None:
    """``compute_metrics`` from app.analysis when it exists (lead: the report hook)."""
    try:
        from app.analysis.metrics import compute_metrics
    except ImportError:
        return None

    def run(trace: RunTrace) -> Any:
        return compute_metrics(trace)

    return run


@contextmanager
def sqlite_db() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="tt-bench-") as d:
        yield f"sqlite:///{Path(d) / 'bench.db'}"


@contextmanager
def postgres_db() -> Iterator[str]:
    base = make_url(os.environ.get("TOKENTRACE_TEST_PG_URL") or DEFAULT_PG)
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    name = f"tt_bench_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def bench(url: str, records: list[RequestRecord]) -> dict[str, Any]:
    n_events = sum(r.event_t_ns.shape[0] for r in records)
    upgrade_database(url)
    engine = make_engine(url)
    sessions = session_factory(engine)
    spec = RunSpec(base_url="http://127.0.0.1:8000", model="bench-model")
    out: dict[str, Any] = {"requests": len(records), "events": n_events}
    try:
        gc.collect()
        t0 = time.perf_counter()
        with session_scope(sessions) as s:
            run_id = repo.create_run(s, spec, source="bench")
            repo.insert_requests(s, run_id, records)
        ingest = time.perf_counter() - t0
        out["ingest_s"] = ingest
        out["ingest_events_per_s"] = n_events / ingest

        trace: RunTrace | None = None
        for label in ("load_cold_s", "load_warm_s"):
            trace = None
            gc.collect()
            t0 = time.perf_counter()
            with session_scope(sessions) as s:
                trace = repo.load_trace(s, run_id)
            out[label] = time.perf_counter() - t0
        assert trace is not None and trace.n_events == n_events
        out["load_events_per_s"] = n_events / out["load_warm_s"]

        compute = _compute_metrics_hook()
        if compute is not None:
            t0 = time.perf_counter()
            compute(trace)
            out["compute_metrics_s"] = time.perf_counter() - t0
            out["full_report_s"] = out["load_warm_s"] + out["compute_metrics_s"]
        else:
            out["compute_metrics_s"] = None  # HOOK: app.analysis.metrics.compute_metrics
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                pages = conn.execute(text("PRAGMA page_count")).scalar_one()
                size = conn.execute(text("PRAGMA page_size")).scalar_one()
                out["db_bytes"] = int(pages) * int(size)
            else:
                out["db_bytes"] = int(
                    conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
                )
        out["bytes_per_event"] = out["db_bytes"] / max(n_events, 1)
    finally:
        engine.dispose()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sqlite", action="store_true")
    p.add_argument("--postgres", action="store_true")
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--tokens", type=int, default=1_000)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/storage.json"))
    args = p.parse_args(argv)
    backends = [b for b in ("sqlite", "postgres") if getattr(args, b)] or ["sqlite", "postgres"]

    t0 = time.perf_counter()
    records = synthetic_records(args.requests, args.tokens)
    print(f"built {args.requests} x {args.tokens} events in {time.perf_counter() - t0:.2f} s")
    results: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "requests": args.requests,
        "tokens_per_request": args.tokens,
        "backends": {},
    }
    for backend in backends:
        ctx = sqlite_db() if backend == "sqlite" else postgres_db()
        try:
            with ctx as url:
                r = bench(url, records)
        except Exception as exc:  # report and go on with the other backend
            print(f"{backend}: FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
            results["backends"][backend] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        results["backends"][backend] = r
        line = (
            f"{backend:8s} ingest {r['ingest_s']:.3f} s"
            f" ({r['ingest_events_per_s'] / 1e6:.1f} M ev/s)"
            f" | load cold {r['load_cold_s']:.3f} s, warm {r['load_warm_s']:.3f} s"
            f" ({r['load_events_per_s'] / 1e6:.1f} M ev/s) | {r['bytes_per_event']:.2f} B/event"
        )
        if r.get("compute_metrics_s") is not None:
            line += (
                f" | compute {r['compute_metrics_s']:.3f} s, full report {r['full_report_s']:.3f} s"
            )
        print(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
