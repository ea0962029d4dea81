"""A run dealt over workers, merged (pure): the shards' reports (each shard's ``RunMeta``
and what the server knows of its job) become one run's metadata, status, notes and lost
count, with one row per shard for the run page's "By shard" table (``load_stats.shards``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np

from app.client.shards.plan import deal
from app.domain import RunStatus
from app.protocol.clock_sync import MAX_BOUND_NS
from app.protocol.wire import RunMeta

SHARDS_KEY = "shards"  # load_stats: the per-shard rows


@dataclass(frozen=True)
class ShardEnd:
    """What the server has of one shard when the run ends."""

    shard: int
    job_state: str  # the shard job's terminal state
    error: str | None
    run_status: RunStatus | None  # the shard's own outcome (None: it never completed)
    notes: list[str]
    lost: int
    meta: RunMeta | None
    stored: int  # its requests stored (warm-ups included)
    ok: int  # of which measured and ok
    worker: str | None


_HEALTH_KEYS = ("loop_lag_ms", "read_delay_ms", "cpu_wait_ms")


def worst_health(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """The client's health over every shard, as a run over load processes has it: event-loop
    lag, read delay and CPU wait as the worst shard had them (the largest p50, p99 and max of
    any shard, the samples of all), the CPU wait in all summed. A key no shard has is left out."""
    out: dict[str, Any] = {}
    for key in _HEALTH_KEYS:
        have = [d for d in (s.get(key) for s in stats) if isinstance(d, dict) and d.get("n")]
        if not have:
            continue
        out[key] = {
            "n": sum(int(d["n"]) for d in have),
            **{q: _largest(d.get(q) for d in have) for q in ("p50_ms", "p99_ms", "max_ms")},
        }
    totals = [float(t) for t in (s.get("cpu_wait_total_ms") for s in stats) if _number(t)]
    if totals:
        out["cpu_wait_total_ms"] = sum(totals)
    return out


def _number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _largest(values: Any) -> float | None:
    have = [float(v) for v in values if _number(v)]
    return max(have) if have else None


def planned_shares(spec: dict[str, Any]) -> list[int] | None:
    """Each shard's measured requests as ``plan.deal`` deals them (None: not known ahead,
    a whole trace or multi-turn sessions)."""
    n, k = spec.get("num_prompts"), int(spec.get("shards") or 1)
    if not isinstance(n, int) or spec.get("multi_turn"):
        return None
    units = max(1, min(k, spec.get("max_concurrency") or k, n))
    owners = deal(n, units, spec.get("max_concurrency"))
    counts = np.bincount(owners, minlength=k).tolist()
    return [int(c) for c in counts[:k]] + [0] * max(0, k - len(counts))


def _status(ends: list[ShardEnd]) -> RunStatus:
    own = [e.run_status for e in ends]
    if any(s is RunStatus.CANCELLED for s in own) or any(e.job_state == "cancelled" for e in ends):
        return RunStatus.CANCELLED
    if all(s is RunStatus.SUCCEEDED for s in own):
        return RunStatus.SUCCEEDED
    if all(s is RunStatus.FAILED or s is None for s in own) and not any(e.stored for e in ends):
        return RunStatus.FAILED
    return RunStatus.PARTIAL


def _row(e: ShardEnd, planned: int | None) -> dict[str, Any]:
    row: dict[str, Any] = {}
    if e.meta is not None and isinstance(e.meta.load_stats.get("shard"), dict):
        row = dict(e.meta.load_stats["shard"])
    row.setdefault("planned", planned)
    row.setdefault("ok", e.ok)
    row.update(shard=e.shard, worker=e.worker, state=e.job_state, stored=e.stored)
    if e.run_status is None:
        measured = e.stored  # a lost shard's warm-ups are few; its planned count says the rest
        row["lost"] = max(0, (planned or 0) - measured) if planned is not None else None
        row["error"] = e.error
    clock = row.get("clock")
    bound = clock.get("bound_ns") if isinstance(clock, dict) else None
    offset = clock.get("offset_ns") if isinstance(clock, dict) else None
    row["clock_offset_ms"] = offset / 1e6 if isinstance(offset, int) else None
    row["clock_bound_ms"] = bound / 1e6 if isinstance(bound, int) else None
    row["clock_flagged"] = isinstance(bound, int) and bound > MAX_BOUND_NS
    return row


def merge_shards(
    ends: list[ShardEnd], spec: dict[str, Any]
) -> tuple[RunStatus, list[str], int, RunMeta | None]:
    """(status, notes, lost, meta) of the one run its shards made."""
    shares = planned_shares(spec)
    rows = [_row(e, shares[e.shard] if shares else None) for e in ends]
    notes: list[str] = []
    lost = 0
    for e, row in zip(ends, rows, strict=True):
        notes += [f"shard {e.shard}: {n}" for n in e.notes]
        lost += e.lost
        if e.run_status is None:
            gone = row.get("lost")
            gone_text = (
                f"{gone} requests lost" if gone is not None else "its unstored requests lost"
            )
            notes.append(
                f"shard {e.shard} lost ({e.error or e.job_state}): {e.stored} of its requests "
                f"stored, {gone_text}"
            )
            lost += int(gone or 0)
        if row["clock_flagged"]:
            notes.append(
                f"shard {e.shard}: its worker's clock bound {row['clock_bound_ms']:.1f} ms "
                f"exceeds {MAX_BOUND_NS / 1e6:.0f} ms: its times against the other shards' "
                "are flagged"
            )
    metas = [(e.shard, e.meta) for e in ends if e.meta is not None]
    meta = None
    if metas:
        base = metas[0][1].model_copy(deep=True)
        counts: dict[str, int] = {}
        for _, m in metas:
            c = m.load_stats.get("counts")
            for key, v in (c or {}).items() if isinstance(c, dict) else ():
                if isinstance(v, int) and not isinstance(v, bool):
                    counts[key] = counts.get(key, 0) + v
        stats = dict(base.load_stats)
        stats.pop("shard", None)
        stats.pop("clock_sync", None)  # each shard's is in its row
        stats["counts"] = counts
        stats.update(worst_health([m.load_stats for _, m in metas]))
        stats[SHARDS_KEY] = rows
        procs = [  # a shard dealt over its worker's load processes: each, naming its shard
            {**row, "shard": k}
            for k, m in metas
            for row in (m.load_stats.get("processes") or [])
            if isinstance(row, dict)
        ]
        if procs:
            stats["processes"] = procs
        else:
            stats.pop("processes", None)
        validity = [f"shard {k}: {n}" for k, m in metas for n in m.validity]
        meta = base.model_copy(
            update={
                "load_stats": stats,
                "validity": validity,
                "client_limited": any(m.client_limited for _, m in metas),
            }
        )
    return _status(ends), notes, lost, meta
