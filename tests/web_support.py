"""Real runs for the dashboard tests: benchmarks against the simulator, an import, and an
empty database; plus the app with the pages mounted."""

from __future__ import annotations

import functools
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from sqlalchemy.orm import Session, sessionmaker

from app.api.app import create_app
from app.client.spec import RunSpec
from app.services.file_imports import import_path
from app.services.runs import execute_bench, open_database
from app.settings import Settings
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread

CSV_LOG = """request_id,start_ts,first_token_ts,end_ts,input_tokens,output_tokens
r1,100.000,100.120,100.900,200,50
r2,100.100,100.260,101.300,210,60
r3,100.200,100.350,100.700,190,1
"""


@dataclass(frozen=True)
class Seeded:
    url: str
    sessions: sessionmaker[Session]
    normal: str  # 60 requests, some errors, SLOs set
    all_errors: str  # every request failed
    one: str  # a single request
    imported: str  # summary-only CSV import


def bench(sessions: sessionmaker[Session], config: SimConfig, name: str, **spec: object) -> str:
    sim = start_simulator_thread(config)
    try:
        fields: dict[str, object] = {
            "base_url": sim.base_url,
            "model": "tokentrace-sim",
            "num_prompts": 60,
            "request_rate": 200.0,
            "input_len": 64,
            "output_len": 24,
            "seed": 3,
        }
        fields.update(spec)
        out = execute_bench(RunSpec.model_validate(fields), sessions=sessions, name=name)
    finally:
        sim.stop()
    assert out.run_id is not None
    return out.run_id


def seed(tmp: Path) -> Seeded:
    """The seeded runs in ``tmp/web.db``: a copy of one file seeded per test process (in
    the pytest base temporary directory, ``tmp``'s parent), so that each module has its
    own database (its tests may write to it) without running the benchmarks again."""
    template, ids = _seeded_template(tmp.parent / "web-seed")
    path = tmp / "web.db"
    shutil.copyfile(template, path)
    url = f"sqlite:///{path}"
    return Seeded(url, open_database(url), *ids)


@functools.cache
def _seeded_template(tmp: Path) -> tuple[Path, tuple[str, str, str, str]]:
    """The seeded file (closed: its WAL checkpointed into it) and its run ids."""
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "web.db"
    sessions = open_database(f"sqlite:///{path}")
    normal = bench(
        sessions,
        SimConfig(ttft_ms=15, itl_ms=1.5, itl_jitter_ms=0.5, error_rate=0.1, seed=5),
        "<b>normal</b> & co",
        goodput={"ttft": 30.0},
        tags=["web", "<i>x</i>"],
    )
    all_errors = bench(sessions, SimConfig(error_rate=1.0, seed=2), "all errors", num_prompts=5)
    one = bench(sessions, SimConfig(ttft_ms=5, itl_ms=1), "one request", num_prompts=1)
    f = tmp / "log.csv"
    f.write_text(CSV_LOG)
    imported = import_path(sessions, "csv", f, name="imported log")[0]
    sessions.kw["bind"].dispose()  # the last connection closed: the WAL is checkpointed
    for extra in ("-wal", "-shm", "-journal"):
        assert not path.with_name(path.name + extra).exists(), "seeded file not checkpointed"
    return path, (normal, all_errors, one, imported)


def web_app(url: str) -> FastAPI:
    return create_app(Settings(database_url=url, local_worker=False))


CSRF_FIELD = re.compile(r'name="csrf" value="([^"]*)"')


def csrf_of(client: Any, page: str = "/signin") -> str:
    """The CSRF token the dashboard's forms carry for this client (``page`` renders one; the
    sign-in page also sets its cookie)."""
    m = CSRF_FIELD.search(client.get(page).text)
    return m.group(1) if m else ""


def post_form(client: Any, path: str, data: dict[str, Any], **kw: Any) -> Any:
    """A form post as the dashboard's own page sends it: its CSRF token and this site's
    ``Origin``."""
    page = "/signin" if path == "/signin" else "/launch"
    headers = {"Origin": str(client.base_url).rstrip("/")} | kw.pop("headers", {})
    return client.post(path, data=data | {"csrf": csrf_of(client, page)}, headers=headers, **kw)


def sign_in(client: Any, token: str, next_path: str = "/") -> Any:
    return post_form(client, "/signin", {"token": token, "next": next_path}, follow_redirects=False)
