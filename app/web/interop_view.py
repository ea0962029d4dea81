"""What an imported file says about the run it measured, as the run page shows it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.storage.interop import ImportInfo

SETUP_LABELS = {
    "strategy": "load strategy",
    "load": "load",
    "load_kind": "load kind",
    "duration_s": "duration (s)",
    "requests": "requests",
    "start_time": "started",
    "end_time": "ended",
    "benchmark_index": "benchmark in the file",
    "benchmark_id": "benchmark id",
}


@dataclass(frozen=True, slots=True)
class ImportSetup:
    """What an imported file says about the run it measured (imports have no spec of
    ours, no schedule and no client of ours)."""

    source: str  # "CSV log", "GuideLLM 0.8.1 file guidellm-benchmarks.json"
    model: str | None
    target: str | None
    rows: list[tuple[str, str]]  # (setting, value) as the file states them


def _setting(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def import_setup(
    source: str, info: ImportInfo | None, *, model: str | None, target: str | None
) -> ImportSetup:
    """The header and settings table of an imported run: the tool and file it came from
    and every setting the file states (its ``meta``), in a stable order."""
    if info is None:
        fmt = source.removeprefix("import:") or "file"
        return ImportSetup(f"{fmt.upper() if fmt == 'csv' else fmt} log", model, target, [])
    where = f"{info.tool} file {info.file_name}" if info.file_name else info.tool
    meta = info.meta or {}
    keys = [k for k in SETUP_LABELS if k in meta] + sorted(k for k in meta if k not in SETUP_LABELS)
    rows = [
        (SETUP_LABELS.get(k, k.replace("_", " ")), _setting(meta[k]))
        for k in keys
        if meta[k] is not None and not isinstance(meta[k], dict | list)
    ]
    return ImportSetup(where, model, target, rows)
