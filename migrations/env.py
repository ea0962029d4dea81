"""Alembic environment for tokentrace.

URL precedence: ``-x url=...`` on the command line, then ``sqlalchemy.url`` in the Alembic
config (``app.storage.db.upgrade_database`` sets it), then ``Settings().database_url``
(``TOKENTRACE_DATABASE_URL`` or the default SQLite file).
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection

from app.settings import Settings
from app.storage.db import make_engine
from app.storage.models import Base

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url")
    if not url:
        url = config.get_main_option("sqlalchemy.url")
    if not url:
        url = Settings().database_url
    return url


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


def _run(connection: Connection) -> None:
    """SQLite: foreign keys off while migrating (a batch operation recreates a table, and
    dropping the old one with them on would cascade-delete every row that points at it)."""
    sqlite = connection.dialect.name == "sqlite"
    if sqlite:
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
        connection.commit()  # ends the autobegun transaction: Alembic's own then commits
    try:
        _migrate(connection)
    finally:
        if sqlite:
            connection.exec_driver_sql("PRAGMA foreign_keys=ON")
            connection.commit()


def _migrate(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,  # SQLite ALTER TABLE support for future revisions
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
