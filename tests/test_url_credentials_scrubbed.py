"""Credentials in a URL are neither stored nor listed (issue 23, item 8): rows stored
before the spec refused them lose them in migration 0014 (runs, their jobs and sweeps, on
SQLite and PostgreSQL), and an imported file's target loses them on the way in."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from app.client.url_checks import without_credentials
from app.importers.common import ImportedRun
from app.storage.db import downgrade_database, make_engine, upgrade_database
from tests.api_support import SPEC, api_client

SECRET = "s3cret-pw"
DIRTY = f"http://alice:{SECRET}@10.1.2.3:8000"


def test_without_credentials() -> None:
    assert without_credentials(DIRTY + "/v1") == "http://10.1.2.3:8000/v1"
    assert without_credentials("https://a@b@h/x?u=c@d") == "https://h/x?u=c@d"
    assert without_credentials("http://h:1/p@q") == "http://h:1/p@q"  # a path is left
    run = ImportedRun(name="r", format="guidellm", tool="t", profile=None, records=[],
                      summary_only=True, target_url=DIRTY)  # fmt: skip
    assert run.target_url == "http://10.1.2.3:8000"


def _tables() -> dict[str, sa.TableClause]:
    runs = sa.table("runs", sa.column("id"), sa.column("spec", sa.JSON), sa.column("target_url"))
    return {
        "runs": runs,
        "jobs": sa.table("jobs", sa.column("id"), sa.column("spec", sa.JSON)),
        "sweeps": sa.table("sweeps", sa.column("id"), sa.column("spec", sa.JSON)),
    }


def _dirty(spec: dict[str, Any]) -> dict[str, Any]:
    out = dict(spec)
    if "base_url" in out:
        out |= {"base_url": DIRTY, "metrics_url": DIRTY + "/metrics"}
    if isinstance(out.get("bench"), dict):
        out["bench"] = _dirty(out["bench"])
    return out


def test_migration_0014_drops_stored_url_credentials(db_url: str) -> None:
    with api_client(db_url) as api:
        api.create_run()
        r = api.client.post("/api/v1/sweeps", json=SPEC | {"rates": [1.0]}, headers=api.h(api.run))
        assert r.status_code == 201, r.text
    engine = make_engine(db_url)
    try:
        tables = _tables()
        with engine.begin() as c:  # what an earlier version let in
            for name, t in tables.items():
                for row in c.execute(sa.select(t)).mappings().all():
                    values: dict[str, Any] = {"spec": _dirty(row["spec"])}
                    if name == "runs":
                        values["target_url"] = DIRTY
                    c.execute(t.update().where(t.c.id == row["id"]).values(**values))
        downgrade_database(db_url, "0013")
        upgrade_database(db_url)
        with engine.connect() as c:
            dumped = {name: c.execute(sa.select(t)).mappings().all() for name, t in tables.items()}
    finally:
        engine.dispose()
    counts = {name: len(rows) for name, rows in dumped.items()}
    assert counts == {"runs": 1, "jobs": 2, "sweeps": 1}  # a run's job, a sweep's job
    for rows in dumped.values():
        for row in rows:
            assert SECRET not in str(dict(row)), row
            spec = row["spec"]
            bench = spec.get("bench", spec) if isinstance(spec.get("bench"), dict) else spec
            if "base_url" in bench:
                assert bench["base_url"] == "http://10.1.2.3:8000"
                assert bench["metrics_url"] == "http://10.1.2.3:8000/metrics"
    assert {row["target_url"] for row in dumped["runs"]} == {"http://10.1.2.3:8000"}
