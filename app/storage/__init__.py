"""Persistence: SQLAlchemy models, Alembic upgrades, packed event logs and the repository.

Callers create engines (``make_engine``) and own sessions and commits (``session_scope``).
"""

from app.protocol.packing import EventArrays, pack_events, unpack_events, unpack_many
from app.storage import models_interop as models_interop  # imports, server metrics (0005)
from app.storage import models_probes as models_probes  # probe tables (0003_probes)
from app.storage import models_series as models_series  # series and alerts (0016)
from app.storage.db import (
    downgrade_database,
    make_engine,
    migrations_dir,
    session_factory,
    session_scope,
    upgrade_database,
)
from app.storage.models import Base, Request, Run
from app.storage.models_compare import Baseline, Sweep, SweepStep  # noqa: F401
from app.storage.repository import (
    NotFoundError,
    count_requests,
    count_runs,
    create_run,
    delete_requests,
    delete_run,
    find_run,
    finish_run,
    get_request_events,
    get_run,
    insert_requests,
    list_runs,
    load_records,
    load_trace,
    new_run_id,
    run_spec,
    set_note,
    set_tags,
    start_run,
    update_run,
)

__all__ = [
    "Base",
    "EventArrays",
    "NotFoundError",
    "Request",
    "Run",
    "count_requests",
    "count_runs",
    "create_run",
    "delete_requests",
    "delete_run",
    "downgrade_database",
    "find_run",
    "finish_run",
    "get_request_events",
    "get_run",
    "insert_requests",
    "list_runs",
    "load_records",
    "load_trace",
    "make_engine",
    "migrations_dir",
    "new_run_id",
    "pack_events",
    "run_spec",
    "session_factory",
    "session_scope",
    "set_note",
    "set_tags",
    "start_run",
    "unpack_events",
    "unpack_many",
    "update_run",
    "upgrade_database",
]
