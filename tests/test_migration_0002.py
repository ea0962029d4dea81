"""Migration 0002 (jobs, workers, tokens, batches) upgrades and downgrades cleanly."""

from __future__ import annotations

from sqlalchemy import inspect

from app.storage.db import downgrade_database, make_engine, upgrade_database

NEW_TABLES = {"jobs", "workers", "api_tokens", "job_batches"}


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_0002_up_down_up(db_url: str) -> None:
    assert _tables(db_url) >= NEW_TABLES
    downgrade_database(db_url, "0001")
    tables = _tables(db_url)
    assert not (NEW_TABLES & tables) and {"runs", "requests"} <= tables
    upgrade_database(db_url)
    assert _tables(db_url) >= NEW_TABLES
