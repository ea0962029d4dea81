"""The run page's series line (which series the run is in, its state there and why) for
``templates/_run_series_report.html``."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from app.services import series as series_svc
from app.storage.db import session_scope


def add_series(ctx: dict[str, Any], sessions: sessionmaker[Session], run_id: str) -> None:
    with session_scope(sessions) as s:
        ctx["run_series"] = series_svc.series_of_run(s, run_id)
