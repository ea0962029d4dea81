"""An agent trace's metrics per session and per depth (pure), from its requests' records
(``AgentRow``: a record's times, status, TTFT and ``AgentLink``; docs/metrics.md).

For one request: *ready* is when its parents' latest end plus its delay came (a root: its
session's start plus its delay), the record's ``scheduled_ns``; *sent* and *end* are the
record's; its *duration* is end - sent.

Per session:

* **wall time**: its last request's end minus its start (a root's ready time minus that
  root's delay, the earliest of its roots');
* **critical path**: the longest chain through its DAG of (delay + duration) summed over the
  chain's requests, the time the session would take if every request were sent the moment
  it was ready; requests sent and ended only (a failed request's unsent descendants add
  nothing);
* **queueing**: over its successful requests, the sum of (sent - ready) + TTFT: waiting for
  a slot or the client, then for the server's first token;
* **generation**: over the same requests, the sum of (end - sent - TTFT): streaming the rest.
  Both sum time over requests (parallel branches add up), so their sum can exceed the wall
  time; their share is what is compared.

Per depth (0: the roots; else 1 + the deepest parent's), over every session: TTFT's count,
mean, p50 and p99 over the successful requests at that depth (linear percentiles).

``start_lags``: per child request, its send minus (its parents' latest end + its delay): how
late the client sent it against the trace's schedule (the benchmark's figure).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from app.analysis.metric_defs import TTFT
from app.analysis.metrics import basis, per_request_values
from app.domain import AgentLink, RequestRecord, RequestStatus, trace_from_records

NS_PER_MS = 1e6
STATS_KEY = "agent_sessions"  # where a run's tables are kept (load_stats)


@dataclass(frozen=True, slots=True)
class AgentRow:
    """One measured request of an agent trace."""

    index: int
    session: int
    scheduled_ns: int  # ready (run-relative)
    sent_ns: int | None
    end_ns: int | None
    ok: bool
    ttft_ns: float  # NaN where none (a failed request)
    link: AgentLink


def _ms(ns: float) -> float:
    return ns / NS_PER_MS


def critical_path_ns(rows: Sequence[AgentRow]) -> int:
    """The longest chain of (delay + duration) through one session's DAG (rows sent and
    ended only; a parent missing from ``rows`` adds nothing)."""
    by_index = {r.index: r for r in rows if r.sent_ns is not None and r.end_ns is not None}
    memo: dict[int, int] = {}
    for start in sorted(by_index, key=lambda i: by_index[i].link.depth):
        r = by_index[start]
        assert r.sent_ns is not None and r.end_ns is not None
        before = max((memo[p] for p in r.link.parents if p in memo), default=0)
        memo[start] = before + r.link.delay_ns + (r.end_ns - r.sent_ns)
    return max(memo.values(), default=0)


def session_row(session: int, rows: Sequence[AgentRow]) -> dict[str, object]:
    """One session's figures (module docstring); times in ms."""
    ended = [r for r in rows if r.end_ns is not None]
    roots = [r for r in rows if not r.link.parents]
    start = min((r.scheduled_ns - r.link.delay_ns for r in roots), default=None)
    wall = None
    if start is not None and ended:
        wall = _ms(max(r.end_ns for r in ended if r.end_ns is not None) - start)
    queueing = generation = 0.0
    counted = 0
    for r in rows:
        if not r.ok or r.sent_ns is None or r.end_ns is None or not math.isfinite(r.ttft_ns):
            continue
        counted += 1
        queueing += (r.sent_ns - r.scheduled_ns) + r.ttft_ns
        generation += (r.end_ns - r.sent_ns) - r.ttft_ns
    total = queueing + generation
    return {
        "session": session,
        "requests": len(rows),
        "ok": sum(1 for r in rows if r.ok),
        "max_depth": max((r.link.depth for r in rows), default=0),
        "wall_ms": wall,
        "critical_path_ms": _ms(critical_path_ns(rows)) if ended else None,
        "queueing_ms": _ms(queueing) if counted else None,
        "generation_ms": _ms(generation) if counted else None,
        "queueing_share": queueing / total if counted and total > 0 else None,
    }


def session_table(rows: Iterable[AgentRow]) -> list[dict[str, object]]:
    """One row per session, by session number."""
    by_session: dict[int, list[AgentRow]] = {}
    for r in rows:
        by_session.setdefault(r.session, []).append(r)
    return [session_row(s, by_session[s]) for s in sorted(by_session)]


def _stats(values: list[float]) -> dict[str, float | int | None]:
    v = np.asarray([x for x in values if math.isfinite(x)], np.float64)
    if v.size == 0:
        return {"n": 0, "mean": None, "p50": None, "p99": None}
    p50, p99 = np.percentile(v, [50, 99])
    return {"n": int(v.size), "mean": float(v.mean()), "p50": float(p50), "p99": float(p99)}


def depth_table(rows: Iterable[AgentRow]) -> list[dict[str, object]]:
    """TTFT (ms) by depth over every session's successful requests."""
    by_depth: dict[int, list[AgentRow]] = {}
    for r in rows:
        by_depth.setdefault(r.link.depth, []).append(r)
    out: list[dict[str, object]] = []
    for d in sorted(by_depth):
        rs = by_depth[d]
        ttfts = [_ms(r.ttft_ns) for r in rs if r.ok]
        out.append({"depth": d, "requests": len(rs), "ok": len(ttfts), "ttft": _stats(ttfts)})
    return out


def start_lags(rows: Iterable[AgentRow]) -> list[int]:
    """Per child request sent, its send minus (its parents' latest end + its delay), ns."""
    rs = list(rows)
    by_index = {r.index: r for r in rs}
    out: list[int] = []
    for r in rs:
        if not r.link.parents or r.sent_ns is None:
            continue
        ends = [by_index[p].end_ns for p in r.link.parents if p in by_index]
        if len(ends) != len(r.link.parents) or any(e is None for e in ends):
            continue
        out.append(r.sent_ns - max(e for e in ends if e is not None) - r.link.delay_ns)
    return out


def agent_tables(rows: Sequence[AgentRow]) -> dict[str, object]:
    """What a run keeps (``load_stats[STATS_KEY]``): the session and depth tables."""
    return {"sessions": session_table(rows), "depths": depth_table(rows)}


def rows_of_records(records: Sequence[RequestRecord]) -> list[AgentRow]:
    """The measured requests of an agent trace as rows (TTFT by the registry's metric)."""
    recs = [r for r in records if not r.warmup and r.agent is not None and r.session is not None]
    if not recs:
        return []
    ttft = per_request_values(basis(trace_from_records(recs)))[TTFT.key]
    out: list[AgentRow] = []
    for r, t in zip(recs, ttft.tolist(), strict=True):
        assert r.agent is not None and r.session is not None
        ok = r.status is RequestStatus.OK
        out.append(
            AgentRow(r.index, r.session, r.scheduled_ns, r.sent_ns, r.end_ns, ok, t, r.agent)
        )
    return out
