"""SQL for imports (the file's own figures) and server metric series. No commits here."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session

from app.protocol.prometheus import PrometheusFormatError, Series, parse_label_set
from app.storage.jsonsafe import json_safe
from app.storage.models_interop import RunImport, ServerMetricSample

INSERT_CHUNK = 5000
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


@dataclass(frozen=True, slots=True)
class ImportInfo:
    run_id: str
    format: str
    tool: str
    profile: str | None
    file_name: str | None
    group_id: str
    group_index: int
    figures: dict[str, Any]
    window_s: float | None
    meta: dict[str, Any]


def add_import(
    session: Session,
    run_id: str,
    *,
    format: str,
    tool: str,
    profile: str | None,
    file_name: str | None,
    group_id: str,
    group_index: int,
    figures: dict[str, Any],
    window_s: float | None,
    meta: dict[str, Any],
) -> None:
    session.add(
        RunImport(
            run_id=run_id,
            format=format,
            tool=tool,
            profile=profile,
            file_name=file_name,
            group_id=group_id,
            group_index=group_index,
            figures=json_safe(figures),
            window_s=window_s,
            meta=json_safe(meta),
        )
    )
    session.flush()


def _info(row: RunImport) -> ImportInfo:
    return ImportInfo(
        run_id=row.run_id,
        format=row.format,
        tool=row.tool,
        profile=row.profile,
        file_name=row.file_name,
        group_id=row.group_id,
        group_index=row.group_index,
        figures=dict(row.figures or {}),
        window_s=row.window_s,
        meta=dict(row.meta or {}),
    )


def get_import(session: Session, run_id: str) -> ImportInfo | None:
    row = session.get(RunImport, run_id)
    return None if row is None else _info(row)


def group_runs(session: Session, group_id: str) -> list[str]:
    """The run ids of one imported file, in file order."""
    stmt = (
        select(RunImport.run_id)
        .where(RunImport.group_id == group_id)
        .order_by(RunImport.group_index)
    )
    return list(session.scalars(stmt))


def _quoted(text: str) -> str:
    """``text`` as a quoted string of the exposition format: ``\\``, ``"`` and line feed
    escaped (a raw line feed ended the line: the stored label set read back as a 500)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def label_text(labels: dict[str, str]) -> str:
    """Canonical label set: ``k="v"`` pairs sorted by key, comma-separated, in the
    exposition format (a name outside ``[a-zA-Z_][a-zA-Z0-9_]*`` is quoted, as Prometheus 3
    writes UTF-8 names), so ``prometheus_client`` reads it back exactly."""
    return ",".join(
        f"{k if _LABEL_NAME.fullmatch(k) else _quoted(k)}={_quoted(v)}"
        for k, v in sorted(labels.items())
    )


def _parse_labels(text: str) -> dict[str, str]:
    """A stored label set. One an older version stored with a raw line feed in a value
    (unescaped) is read with the line feed restored; one that still cannot be read is
    returned whole as the value of the label ``labels``, never an error: the page shows
    what was stored."""
    if not text:
        return {}
    for candidate in (text, text.replace("\n", "\\n")):
        try:
            return dict(parse_label_set("{" + candidate + "}", 0))
        except PrometheusFormatError:
            continue
    return {"labels": text}


def replace_server_metrics(session: Session, run_id: str, series: Sequence[Series]) -> int:
    """Store a run's scraped series, replacing any stored before (so a retry is harmless).
    Returns the number of samples stored."""
    session.execute(delete(ServerMetricSample).where(ServerMetricSample.run_id == run_id))
    rows: list[dict[str, Any]] = []
    for s in series:
        if len(s.t_ns) != len(s.values):
            raise ValueError(f"series {s.name}: {len(s.t_ns)} times but {len(s.values)} values")
        labels = label_text(s.labels)
        for t, v in zip(s.t_ns, s.values, strict=True):
            rows.append(
                {
                    "run_id": run_id,
                    "name": s.name,
                    "labels": labels,
                    "kind": s.kind,
                    "t_ns": int(t),
                    "value": float(v),
                }
            )
    for lo in range(0, len(rows), INSERT_CHUNK):
        session.execute(insert(ServerMetricSample), rows[lo : lo + INSERT_CHUNK])
    session.flush()
    return len(rows)


def load_server_metrics(session: Session, run_id: str) -> list[Series]:
    """A run's scraped series (ordered by name, labels), samples in time order."""
    t = ServerMetricSample
    stmt = (
        select(t.name, t.labels, t.kind, t.t_ns, t.value)
        .where(t.run_id == run_id)
        .order_by(t.name, t.labels, t.t_ns)
    )
    out: dict[tuple[str, str], Series] = {}
    for name, labels, kind, t_ns, value in session.execute(stmt):
        ser = out.get((name, labels))
        if ser is None:
            ser = out[(name, labels)] = Series(name, _parse_labels(labels), kind)
        ser.t_ns.append(int(t_ns))
        ser.values.append(float(value))
    return list(out.values())


def count_server_samples(session: Session, run_id: str) -> int:
    stmt = select(func.count()).select_from(ServerMetricSample)
    return int(session.scalar(stmt.where(ServerMetricSample.run_id == run_id)) or 0)
