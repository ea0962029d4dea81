"""Shared fixtures: migrated SQLite and PostgreSQL databases.

- ``sqlite_url``: a fresh SQLite file in ``tmp_path``, migrated by Alembic.
- ``pg_url``: a fresh schema (per test) inside a database created once per test session
  (``tt_test_<random>``, dropped at the end) on the server at ``TOKENTRACE_TEST_PG_URL``
  (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``), migrated by Alembic.
  Tests using it are marked ``postgres`` and skipped, with the reason, when the server
  cannot be reached.
- ``db_url``: parametrized over both; ``db_engine`` / ``db_session`` build on it.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session

from app.storage.db import make_engine, session_factory, upgrade_database

pytest_plugins = ["tests.live_server"]  # the `live_server` fixture

# TestClient sends ``Host: testserver``: allowed in tests (as Django's test runner does), with
# the loopback names the live servers use. tests/test_allowed_hosts.py sets its own lists.
os.environ.setdefault("TOKENTRACE_ALLOWED_HOSTS", "testserver,localhost,127.0.0.1,::1")

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _pg_base_url() -> URL:
    url = make_url(os.environ.get("TOKENTRACE_TEST_PG_URL") or DEFAULT_PG_URL)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return url


# Tests whose assertions are about time (a client's own lag, a fidelity bound, a deadline
# against a stall) or that load every core themselves (a real model, the CPU probes): marked
# ``serial``, they run after the parallel pass with nothing else on the machine (Makefile:
# ``make pytest``). A module name marks the whole module; ``module::test`` one test (every
# parametrization).
SERIAL: frozenset[str] = frozenset(
    {
        "test_realmodel",
        "test_probes_cpu",
        "test_sched",
        "test_tls_client",
        "test_keepalive",
        "test_trust",
        "test_target_faults",
        "test_turn_wire_order",
        "test_server_timing",
        "test_worker_faults",
        "test_sweeps_baselines",
        "test_series_cli",
        "test_cancelled_runs",
        "test_workload_traces",
        "test_queue_wait",
        "test_shards_run",
        "test_browser_compare",  # a regression measured on the simulator, then shown
        "test_compare_targets",  # the same
        "test_serve_signals",  # a stopped server's ports are free (no other test took them)
        "test_client::test_run_load_constant_rate_send_lag_small",
        "test_client::test_run_load_max_duration_cancels_and_keeps_measurements",
        "test_interop_service::test_server_metrics_scraped_during_a_local_run",
        "test_sessions::test_next_turn_after_reply_end_plus_think_time",
        "test_sessions::test_stop_during_think_time_ends_the_run",
        "test_simulator::test_ttft_and_itl_follow_the_model",
        "test_simulator::test_metrics_parse_and_count",
        "test_simulator::test_300_concurrent_streams_in_a_separate_process",
        "test_ssrf::test_scraper_keeps_a_status_line_not_the_body",
        "test_sweep_jobs::test_lost_sweep_is_requeued_and_resumed_over_the_protocol",
        "test_sweep_jobs::test_sweep_resumes_after_its_worker_is_killed",
        "test_sweep_jobs::test_auto_sweep_resumed_chooses_the_same_loads",
        "test_sweep_jobs::test_sweep_job_stops_early_at_saturation",
        "test_web_finish_job::test_sweep_slo_form_finds_max_goodput_as_recomputed",
        "test_worker::test_cancel_via_api_reaches_the_worker",
        "test_worker_protocol::test_cancel_at_heartbeat_keeps_measured_data",
        "test_find_max_sweep",
        "test_responses_messages::test_against_the_simulator_its_own_view",
        "test_responses_messages::test_cli_bench_against_the_simulator",
        "test_steady_runs",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "pg_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)
        module = item.path.stem
        name = getattr(item, "originalname", item.name)
        if module in SERIAL or f"{module}::{name}" in SERIAL:
            item.add_marker(pytest.mark.serial)


@pytest.fixture(scope="session")
def _pg_database() -> Iterator[URL | str]:
    """A throwaway database for this test session, or a skip reason (str)."""
    base = _pg_base_url()
    try:
        admin = create_engine(
            base, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}
        )
        with admin.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        yield (
            f"PostgreSQL not reachable at {base.render_as_string(hide_password=True)} "
            f"(set TOKENTRACE_TEST_PG_URL): {type(exc).__name__}: {str(exc).strip()[:200]}"
        )
        return
    name = f"tt_test_{secrets.token_hex(6)}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield base.set(database=name)
    finally:
        _drop_database(admin, name)
        admin.dispose()


def _drop_database(admin: Engine, name: str) -> None:
    with admin.connect() as conn:
        try:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        except Exception:  # PostgreSQL < 13: no FORCE; end the sessions first
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :d AND pid <> pg_backend_pid()"
                ),
                {"d": name},
            )
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))


@contextmanager
def _pg_schema(database: URL | str) -> Iterator[str]:
    """A fresh, migrated schema in the session's PostgreSQL test database (skips the test
    when the server is unreachable), dropped on exit."""
    if isinstance(database, str):
        pytest.skip(database)
    schema = f"t_{secrets.token_hex(6)}"
    admin = create_engine(database, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        url = database.update_query_dict({"options": f"-csearch_path={schema}"})
        rendered = url.render_as_string(hide_password=False)
        upgrade_database(rendered)
        yield rendered
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def pg_url(_pg_database: URL | str) -> Iterator[str]:
    """A fresh, migrated schema in the session's PostgreSQL test database."""
    with _pg_schema(_pg_database) as url:
        yield url


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SQLite file migrated to head per test session (per xdist worker), copied for each
    test: the same bytes Alembic would write, without running every migration each time
    (tests/test_migrations_walk.py runs them)."""
    path = tmp_path_factory.mktemp("template") / "tokentrace.db"
    upgrade_database(f"sqlite:///{path}")
    for extra in ("-wal", "-shm", "-journal"):
        assert not path.with_name(path.name + extra).exists(), "template not checkpointed"
    return path


@pytest.fixture
def sqlite_url(tmp_path: Path, _sqlite_template: Path) -> str:
    """A fresh SQLite database file, migrated to head."""
    path = tmp_path / "db" / "tokentrace.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def module_db_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """``db_url`` shared by a module's tests (for a server they share: one start per
    database, not one per test); its tests must not depend on each other's rows."""
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp("module-db") / "tokentrace.db"
        shutil.copyfile(request.getfixturevalue("_sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    with _pg_schema(request.getfixturevalue("_pg_database")) as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    """Each test runs once on SQLite and once on PostgreSQL."""
    name = "pg_url" if request.param == "postgres" else "sqlite_url"
    url: str = request.getfixturevalue(name)
    return url


@pytest.fixture
def db_engine(db_url: str) -> Iterator[Engine]:
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def db_session(db_engine: Engine) -> Iterator[Session]:
    with session_factory(db_engine)() as session:
        yield session
