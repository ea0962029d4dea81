"""Engines, sessions and schema upgrades. No global state: callers create and own engines."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from app.storage import jsonsafe

SQLITE_BUSY_TIMEOUT_MS = 30_000

# Installed (wheel) location: setup.py copies the top-level migrations/ folder here.
_PACKAGED_MIGRATIONS = Path(__file__).resolve().parent / "_migrations"
# Source checkout / editable install: <repo>/migrations next to <repo>/app.
_REPO_MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"


def migrations_dir() -> Path:
    """The Alembic script directory: packaged copy first, else the repository's folder."""
    for candidate in (_PACKAGED_MIGRATIONS, _REPO_MIGRATIONS):
        if (candidate / "env.py").is_file() and (candidate / "versions").is_dir():
            return candidate
    raise FileNotFoundError(
        "Alembic migrations not found: looked in "
        f"{_PACKAGED_MIGRATIONS} (installed package) and {_REPO_MIGRATIONS} (source checkout)"
    )


def _sqlite_file(url: URL) -> Path | None:
    """The database file of a SQLite URL, or None for in-memory databases."""
    db = url.database
    if not db or db == ":memory:" or db.startswith("file:") or url.query.get("mode") == "memory":
        return None
    return Path(db)


def make_engine(url: str | URL, *, echo: bool = False, **kwargs: Any) -> Engine:
    """Create an engine for ``url``.

    SQLite: creates the file's parent directory, enables WAL, ``foreign_keys=ON``,
    ``synchronous=NORMAL`` (durable across application crashes; the WAL default) and a busy
    timeout, and makes savepoints real (``_sqlite_begin_before_savepoint``). PostgreSQL:
    ``pool_pre_ping``. Both: strict JSON (``jsonsafe.dumps``). Extra keyword arguments go
    to ``create_engine``.
    """
    u = make_url(url)
    backend = u.get_backend_name()
    kwargs.setdefault("json_serializer", jsonsafe.dumps)
    if backend == "sqlite":
        path = _sqlite_file(u)
        if path is not None:
            path.expanduser().parent.mkdir(parents=True, exist_ok=True)
        connect_args = dict(kwargs.pop("connect_args", {}))
        connect_args.setdefault("timeout", SQLITE_BUSY_TIMEOUT_MS / 1000)
        engine = create_engine(u, echo=echo, connect_args=connect_args, **kwargs)
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "savepoint", _sqlite_begin_before_savepoint)
        return engine
    if backend == "postgresql":
        kwargs.setdefault("pool_pre_ping", True)
    return create_engine(u, echo=echo, **kwargs)


def _sqlite_on_connect(dbapi_conn: sqlite3.Connection, _record: object) -> None:
    cur = dbapi_conn.cursor()
    try:
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        mode = cur.execute("PRAGMA journal_mode").fetchone()
        if mode and str(mode[0]).lower() != "memory":
            cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
    finally:
        cur.close()


def _sqlite_begin_before_savepoint(conn: Connection, _name: str | None) -> None:
    """Open the transaction a savepoint belongs to.

    pysqlite (Python < 3.12, its default "legacy" transaction control) sends ``BEGIN`` only
    before the first INSERT/UPDATE/DELETE, so a ``SAVEPOINT`` issued by ``begin_nested()``
    before any write *started* the transaction and its ``RELEASE`` *committed* it: the rows
    written inside the savepoint (a result batch's row) stayed even when the session rolled
    back afterwards (its requests failed). Emitting ``BEGIN IMMEDIATE`` first makes the
    savepoint nest inside a transaction that commits or rolls back as a whole.

    Why not SQLAlchemy's pysqlite recipe (``isolation_level=None`` and ``BEGIN`` at every
    transaction start): a deferred transaction that reads and then writes fails at once
    with "database is locked" when another connection committed in between (WAL: the
    stale snapshot cannot be upgraded, the busy timeout does not apply), and almost every
    route reads before it writes; ``BEGIN IMMEDIATE`` everywhere would serialize readers and
    deadlock a request's second session (``run_report``) behind its first. Keeping the
    legacy mode keeps writes taking the lock at their first statement, waiting with the
    busy timeout, as before; ``BEGIN IMMEDIATE`` takes it the same way."""
    raw: Any = conn.connection.dbapi_connection
    if raw is not None and not raw.in_transaction:
        raw.execute("BEGIN IMMEDIATE")


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions bound to ``engine``; objects stay readable after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits when the block succeeds and rolls back when it raises."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def alembic_config(url: str | URL) -> Any:
    """An Alembic ``Config`` pointing at the project's migrations and ``url``."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    rendered = url.render_as_string(hide_password=False) if isinstance(url, URL) else url
    # ConfigParser interpolation: a literal % must be doubled.
    cfg.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    return cfg


def upgrade_database(url: str | URL, revision: str = "heads") -> None:
    """Run Alembic migrations up to ``revision`` (default: every head) on ``url``.

    Feature migrations may branch from a common parent; "heads" applies every branch."""
    from alembic import command

    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        path = _sqlite_file(u)
        if path is not None:
            path.expanduser().parent.mkdir(parents=True, exist_ok=True)
    if revision == "heads" and _at_heads(u):
        return  # nothing to run: every command that opens the database calls this first
    command.upgrade(alembic_config(url), revision)


@functools.cache
def _script_heads(directory: Path) -> frozenset[str]:
    """The migration scripts' heads, read once per process (the scripts are the install's)."""
    from alembic.script import ScriptDirectory

    return frozenset(ScriptDirectory(str(directory)).get_heads())


def _at_heads(url: URL) -> bool:
    """The database's recorded revisions are exactly the scripts' heads (False on any doubt:
    no version table yet, an unreadable database; Alembic then does the real work)."""
    heads = _script_heads(migrations_dir())
    engine = make_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars()
            return frozenset(str(r) for r in rows) == heads
    except SQLAlchemyError:
        return False
    finally:
        engine.dispose()


def downgrade_database(url: str | URL, revision: str = "base") -> None:
    """Run Alembic migrations down to ``revision`` (default: base, i.e. drop everything)."""
    from alembic import command

    command.downgrade(alembic_config(url), revision)
