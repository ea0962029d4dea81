"""Every Alembic revision upgrades and downgrades cleanly, one step at a time, with rows in
the tables, on SQLite and PostgreSQL. The revisions are read from the script directory, so a
new migration (or a new branch) is covered without editing this test."""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.script import Script, ScriptDirectory

from app.storage.db import alembic_config, make_engine, upgrade_database


def _paths(script: ScriptDirectory) -> list[list[Script]]:
    """For each head: its revisions from the base up, in upgrade order."""
    out = []
    for head in script.get_heads():
        revs = list(script.iterate_revisions(head, "base"))
        out.append(list(reversed(revs)))
    return out


def _value(col: sa.Column[Any], ref: dict[tuple[str, str], Any]) -> Any:
    for fk in col.foreign_keys:
        key = (fk.column.table.name, fk.column.name)
        if key in ref:
            return ref[key]
    t = col.type
    if isinstance(t, sa.Boolean):
        return False
    if isinstance(t, sa.Integer):
        return 1
    if isinstance(t, sa.Float | sa.Numeric):
        return 1.0
    if isinstance(t, sa.DateTime):
        return dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    if isinstance(t, sa.JSON):
        return {}
    if isinstance(t, sa.LargeBinary):
        return b"\x00"
    if isinstance(t, sa.Enum) and t.enums:
        return t.enums[0]
    length = getattr(t, "length", None)
    return ("r-" + col.name)[: length or 64]


def _serial(col: sa.Column[Any]) -> bool:
    """An integer primary key the database numbers itself."""
    return bool(
        col.primary_key and isinstance(col.type, sa.Integer) and col.autoincrement in (True, "auto")
    )


def _fill(url: str) -> dict[str, int]:
    """Insert one row into every empty table (foreign keys pointing at the rows already
    there); return the row count of every table."""
    engine = make_engine(url)
    try:
        meta = sa.MetaData()
        meta.reflect(bind=engine)
        with engine.begin() as conn:
            ref: dict[tuple[str, str], Any] = {}
            for table in meta.sorted_tables:
                if table.name == "alembic_version":
                    continue
                row = conn.execute(sa.select(table).limit(1)).mappings().first()
                if row is None:
                    values = {c.name: _value(c, ref) for c in table.columns if not _serial(c)}
                    conn.execute(table.insert().values(**values))
                    row = conn.execute(sa.select(table).limit(1)).mappings().one()
                for c in table.columns:
                    ref[(table.name, c.name)] = row[c.name]
            return {
                t.name: int(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar() or 0)
                for t in meta.sorted_tables
            }
    finally:
        engine.dispose()


def _down_target(rev: Script) -> str | None:
    down = rev.down_revision
    if down is None:
        return "base"
    return down if isinstance(down, str) else None  # a merge: no single step down


def test_every_revision_up_and_down_with_data(db_url: str) -> None:
    cfg = alembic_config(db_url)
    script = ScriptDirectory.from_config(cfg)
    paths = _paths(script)
    assert paths and all(p[0].down_revision is None for p in paths)
    steps = 0
    for path in paths:
        command.downgrade(cfg, "base")
        for rev in path:
            command.upgrade(cfg, rev.revision)
            counts = _fill(db_url)
            assert all(n >= 1 for name, n in counts.items() if name != "alembic_version"), counts
            steps += 1
        for rev in reversed(path):
            target = _down_target(rev)
            if target is None:
                break
            before = _fill(db_url)
            command.downgrade(cfg, target)
            after = _fill(db_url)
            for name, n in after.items():  # tables that stay keep their rows
                if name in before and name != "alembic_version":
                    assert n == before[name], (rev.revision, name)
        upgrade_database(db_url)  # and back up to every head, with data
    assert steps >= 2
    engine = make_engine(db_url)
    try:
        tables = set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert {"runs", "requests", "jobs", "api_tokens"} <= tables
