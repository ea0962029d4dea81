"""A dashboard form's database write never runs on the server's event loop.

The form handlers are async (they read their body there); a write that waits for a lock on
the loop also stops every other request, the one holding the lock included, whose session
commits through the loop: on SQLite both waited out the 30 s busy timeout (a launch from
the browser timed out under the parallel suite's load), on PostgreSQL a row lock is waited
for without end. Here another connection holds the lock while a form post waits for it:
the server must go on answering, and the post must finish once the lock is released."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
from sqlalchemy.engine import make_url

from tests.live_server import LiveServer
from tests.web_support import csrf_of, sign_in

FORM = {"base_url": "http://127.0.0.1:9", "model": "m", "num_prompts": "2", "endpoint": "chat"}


@contextmanager
def _signed_in(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        assert sign_in(c, server.admin_token, "/launch").status_code == 303
        yield c


def _post_while_locked(
    server: LiveServer,
    c: httpx.Client,
    path: str,
    data: dict[str, str],
    release: Callable[[], None],
) -> httpx.Response:
    """POST the form from a thread while the lock is held; the server answers another
    request meanwhile; then the lock is released and the post's answer returned."""
    token = csrf_of(c, "/launch")
    box: dict[str, Any] = {}

    def post() -> None:
        box["r"] = c.post(
            path, data=data | {"csrf": token}, headers={"Origin": server.url},
            follow_redirects=False,
        )  # fmt: skip

    t = threading.Thread(target=post)
    t.start()
    try:
        time.sleep(0.5)  # the post reaches its write and waits for the lock
        with httpx.Client(base_url=server.url, timeout=10) as other:
            # before: the loop waited with the post (ReadTimeout)
            assert other.get("/healthz").status_code == 200
        assert t.is_alive(), box  # it could not have written: the lock is still held
    finally:
        release()
        t.join(60)
    return box["r"]  # type: ignore[no-any-return]


def test_a_launch_waiting_for_sqlites_write_lock_does_not_stop_the_server(
    tmp_path: Path, live_server: Any
) -> None:
    path = tmp_path / "lock.db"
    server: LiveServer = live_server(f"sqlite:///{path}")
    with _signed_in(server) as c:
        holder = sqlite3.connect(path, isolation_level=None, timeout=30)
        holder.execute("BEGIN IMMEDIATE")  # another writer holds the database
        try:
            r = _post_while_locked(server, c, "/launch", FORM, lambda: holder.execute("COMMIT"))
        finally:
            holder.close()
        assert r.status_code == 303 and r.headers["location"].startswith("/runs/"), r.text[:300]


def test_a_cancel_waiting_for_a_postgres_row_lock_does_not_stop_the_server(
    pg_url: str, live_server: Any
) -> None:
    server: LiveServer = live_server(pg_url)
    with _signed_in(server) as c:
        token = csrf_of(c, "/launch")
        r = c.post(
            "/launch", data=FORM | {"csrf": token}, headers={"Origin": server.url},
            follow_redirects=False,
        )  # fmt: skip
        assert r.status_code == 303
        run_id = r.headers["location"].rsplit("/", 1)[1]
        url = make_url(pg_url)
        schema = dict(url.query).get("options")
        dsn = url.set(drivername="postgresql", query={}).render_as_string(hide_password=False)
        holder = psycopg.connect(dsn, **({"options": schema} if isinstance(schema, str) else {}))
        holder.execute("SELECT id FROM jobs WHERE run_id = %s FOR UPDATE", (run_id,))
        try:
            r = _post_while_locked(
                server, c, f"/runs/{run_id}/cancel", {}, lambda: holder.rollback()
            )
        finally:
            holder.close()
        assert r.status_code == 303 and "done=cancel" in r.headers["location"], r.text[:300]
