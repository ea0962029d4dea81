"""Fast, idempotent bulk insert and read of request rows.

SQLite: one ``INSERT ... ON CONFLICT`` executemany per chunk. PostgreSQL: binary ``COPY``
straight into ``requests`` when no row of the chunk's index range exists yet (inside a
savepoint; a concurrent writer's unique violation falls back to the upsert), otherwise the
same ``INSERT ... ON CONFLICT`` executemany. Reads of the packed blobs use psycopg's binary
result format on PostgreSQL (bytea as text is hex: twice the bytes and a decode). Both fast
paths bypass SQLAlchemy's types, so they apply ``TargetText``'s encoding (a target's error
message with NUL) themselves, and COPY hands a JSON column (``metric_values``) psycopg's
``Json`` wrapper.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Connection,
    Float,
    Insert,
    Integer,
    LargeBinary,
    String,
    Table,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import TypeDecorator, TypeEngine

from app.storage.models import Request
from app.storage.target_text import MARK, TargetText, decode, encode

_KEY = ("run_id", "idx")


def _table() -> Table:
    table = Request.__table__
    assert isinstance(table, Table)
    return table


def upsert_statement(dialect: str, *, replace: bool) -> Insert:
    """``INSERT INTO requests ... ON CONFLICT (run_id, idx) DO NOTHING | DO UPDATE``."""
    table = _table()
    stmt: Any
    if dialect == "sqlite":
        stmt = sqlite.insert(table)
    elif dialect == "postgresql":
        stmt = postgresql.insert(table)
    else:
        raise ValueError(f"bulk insert supports sqlite and postgresql, not {dialect}")
    if replace:
        keep = {"id", *_KEY}
        stmt = stmt.on_conflict_do_update(
            index_elements=list(_KEY),
            set_={c.name: stmt.excluded[c.name] for c in table.columns if c.name not in keep},
        )
    else:
        stmt = stmt.on_conflict_do_nothing(index_elements=list(_KEY))
    result: Insert = stmt
    return result


def insert_rows(
    conn: Connection, run_id: str, rows: list[dict[str, Any]], *, replace: bool
) -> None:
    """Insert request rows of one run in the connection's current transaction."""
    if not rows:
        return
    if conn.dialect.name == "postgresql" and not replace and not _any_in_range(conn, run_id, rows):
        import psycopg

        try:
            with conn.begin_nested():
                _pg_copy(conn, rows)
            return
        except psycopg.errors.UniqueViolation:
            pass  # a concurrent upload got there first: skip its rows below
    conn.execute(upsert_statement(conn.dialect.name, replace=replace), rows)


def _any_in_range(conn: Connection, run_id: str, rows: list[dict[str, Any]]) -> bool:
    idx = [r["idx"] for r in rows]
    t = _table()
    stmt = (
        select(t.c.idx)
        .where(t.c.run_id == run_id, t.c.idx >= min(idx), t.c.idx <= max(idx))
        .limit(1)
    )
    return conn.execute(stmt).first() is not None


def _pg_type(type_: TypeEngine[Any]) -> str:
    if isinstance(type_, TypeDecorator):
        type_ = type_.impl_instance
    for cls, name in (
        (BigInteger, "int8"),
        (Integer, "int4"),
        (Boolean, "bool"),
        (Float, "float8"),
        (LargeBinary, "bytea"),
        (JSON, "json"),
        (String, "text"),  # varchar and text share the binary COPY format
    ):
        if isinstance(type_, cls):
            return name
    raise TypeError(f"no COPY type for {type_!r}")


def _column_default(column: Any) -> Any:
    """What ``INSERT`` would store for a column a row leaves out: its scalar default, else
    NULL (COPY has no defaults of its own for the columns it names)."""
    default = column.default
    if default is not None and getattr(default, "is_scalar", False):
        return default.arg
    return None


def _pg_copy(conn: Connection, rows: list[dict[str, Any]]) -> None:
    cols = [c for c in _table().columns if c.name != "id"]
    names = [c.name for c in cols]
    defaults = {c.name: _column_default(c) for c in cols}
    raw: Any = conn.connection.dbapi_connection
    from psycopg.types.json import Json

    as_json = [j for j, c in enumerate(cols) if isinstance(c.type, JSON)]
    with raw.cursor() as cur:
        sql = f"COPY requests ({', '.join(names)}) FROM STDIN (FORMAT BINARY)"
        with cur.copy(sql) as copy:
            copy.set_types([_pg_type(c.type) for c in cols])
            faithful = [j for j, c in enumerate(cols) if isinstance(c.type, TargetText)]
            for r in rows:
                values = [r[n] if n in r else defaults[n] for n in names]
                for j in faithful:
                    if isinstance(values[j], str):
                        values[j] = encode(values[j])
                for j in as_json:
                    if values[j] is not None:
                        values[j] = Json(values[j])
                copy.write_row(values)


def fetch_rows(
    conn: Connection, columns: Sequence[ColumnElement[Any]], where: Any, order_by: Any
) -> list[tuple[Any, ...]]:
    """``SELECT columns FROM requests WHERE ... ORDER BY ...`` as plain tuples.

    Enum columns may come back as strings (PostgreSQL fast path) or enum members.
    """
    stmt = select(*columns).where(where).order_by(order_by)
    if conn.dialect.name != "postgresql":
        return [tuple(r) for r in conn.execute(stmt)]
    compiled = stmt.compile(dialect=conn.dialect)
    params = compiled.construct_params()
    raw: Any = conn.connection.dbapi_connection
    with raw.cursor(binary=True) as cur:
        cur.execute(str(compiled), params)
        rows = list(cur.fetchall())
    for j, col in enumerate(columns):
        if isinstance(getattr(col, "type", None), TargetText):
            _decode_column(rows, j)
    return rows


def _decode_column(rows: list[tuple[Any, ...]], j: int) -> None:
    """``TargetText.process_result_value`` on column ``j``, in place: only values that
    were escaped (they begin with ``MARK``) are rebuilt."""
    for i, row in enumerate(rows):
        v = row[j]
        if isinstance(v, str) and v.startswith(MARK):
            rows[i] = (*row[:j], decode(v), *row[j + 1 :])
