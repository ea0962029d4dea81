"""Series test data: real runs imported from small CSV logs (``tokentrace import csv``),
each with the TTFTs a test chose, so a trend's values can be recomputed with numpy from
what was written."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from app.services.file_imports import import_path

CSV_HEAD = "request_id,start_ts,first_token_ts,end_ts,input_tokens,output_tokens"


def csv_text(ttfts_ms: list[float], *, input_tokens: int = 200, output_tokens: int = 50) -> str:
    """A CSV log: request j sent at 100 + j/10 s, its first token ``ttfts_ms[j]`` later,
    done 0.5 s after that."""
    lines = [CSV_HEAD]
    for j, ttft in enumerate(ttfts_ms):
        st = 100.0 + j * 0.1
        first = st + ttft / 1000.0
        lines.append(f"r{j},{st:.6f},{first:.6f},{first + 0.5:.6f},{input_tokens},{output_tokens}")
    return "\n".join(lines) + "\n"


def import_run(
    sessions: sessionmaker[Session],
    tmp: Path,
    ttfts_ms: list[float],
    *,
    name: str,
    input_tokens: int = 200,
) -> str:
    """One imported run with these TTFTs; its id."""
    f = tmp / (re.sub(r"[^A-Za-z0-9._-]", "_", name) + ".csv")
    f.write_text(csv_text(ttfts_ms, input_tokens=input_tokens))
    return import_path(sessions, "csv", f, name=name)[0]


def shifted(
    n_runs: int, shift_at: int | None, *, base: float = 100.0, step: float = 40.0,
    noise: float = 2.0, per_run: int = 6, seed: int = 0,
) -> list[list[float]]:  # fmt: skip
    """TTFTs (ms, rounded to 0.1) of ``n_runs`` runs: about ``base``, and ``base + step``
    from run ``shift_at`` on (None: noise only)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n_runs):
        level = base + (step if shift_at is not None and i >= shift_at else 0.0)
        out.append([round(float(x), 1) for x in rng.normal(level, noise, per_run)])
    return out


def p99(values: list[float]) -> float:
    """numpy's linear-interpolation p99: the independent reference."""
    return float(np.percentile(np.asarray(values, np.float64), 99))
