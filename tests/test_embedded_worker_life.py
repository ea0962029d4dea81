"""The embedded worker of ``tokentrace serve`` lives no longer than its server (issue 23,
item 9): SIGKILL the server and its worker is gone within a bounded poll; the token the
worker held is revoked when the server starts again; the token never shows on the worker's
command line."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.services import auth
from app.services.errors import Invalid
from app.services.runs import open_database
from app.storage.db import session_scope
from app.worker.parent_watch import PARENT_GONE_EXIT, watch_parent
from tests.live_server import ROOT, LiveServerFactory

WORKER_GONE_WITHIN_S = 20.0


def _gone(pid: int) -> bool:
    """No such process, or only its zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _worker_children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = [int(k) for k in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
        for k in kids:
            try:
                cmd = Path(f"/proc/{k}/cmdline").read_bytes().split(b"\0")
            except FileNotFoundError:
                continue
            if b"worker" in cmd and b"app.cli.main" in cmd:
                out.append(k)
    return out


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    pairs = (item.decode(errors="replace").partition("=") for item in raw if item)
    return {k: v for k, _, v in pairs}


def _authenticates(db_url: str, secret: str) -> bool:
    sessions = open_database(db_url)
    try:
        with session_scope(sessions) as s:
            return auth.authenticate(s, secret) is not None
    finally:
        bind = sessions.kw.get("bind")
        if bind is not None:
            bind.dispose()


def _wait(pred: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_killed_servers_worker_dies_and_its_token_is_revoked_at_the_next_start(
    live_server: LiveServerFactory, sqlite_url: str
) -> None:
    srv = live_server(sqlite_url, local_worker=True)
    assert srv.proc is not None
    found: list[int] = []
    assert _wait(lambda: found.extend(_worker_children(srv.proc.pid)) or found, 30), srv.log_tail()
    worker = found[0]
    try:
        cmdline = Path(f"/proc/{worker}/cmdline").read_bytes().decode(errors="replace")
        secret = _environ(worker)["TOKENTRACE_WORKER_TOKEN"]
        assert secret.startswith("tt_") and secret not in cmdline
        assert "--exit-with-parent" in cmdline
        assert _authenticates(sqlite_url, secret)

        srv.kill()  # SIGKILL: no shutdown code runs, nothing revokes the token now
        assert _wait(lambda: _gone(worker), WORKER_GONE_WITHIN_S), "the worker outlived it"
        assert _authenticates(sqlite_url, secret)  # still valid until a server starts

        srv.start()
        assert not _authenticates(sqlite_url, secret)
        r = httpx.post(
            srv.url + "/api/v1/workers/register",
            json={"name": "x", "capabilities": {"hostname": "h"}},
            headers={"Authorization": f"Bearer {secret}"},
        )
        assert r.status_code == 401, r.text
        live = [t for t in _tokens(sqlite_url) if t[0].startswith("local-worker@") and t[1] is None]
        assert len(live) == 1  # the new server's own
        assert "revoked the embedded worker token" in srv.log_tail()
    finally:
        if not _gone(worker):
            os.kill(worker, signal.SIGKILL)


def _tokens(db_url: str) -> list[tuple[str, object]]:
    sessions = open_database(db_url)
    try:
        with session_scope(sessions) as s:
            return [(t.name or "", t.revoked_at) for t in auth.list_tokens(s)]
    finally:
        bind = sessions.kw.get("bind")
        if bind is not None:
            bind.dispose()


def test_a_worker_whose_parent_is_already_gone_exits_at_once(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENTRACE_")}
    env |= {"PYTHONPATH": str(ROOT), "TOKENTRACE_WORKER_TOKEN": "tt_x"}
    not_parent = 1  # init is never the parent of this test's child
    cmd = [sys.executable, "-m", "app.cli.main", "worker", "--server", "http://127.0.0.1:9",
           "--state-dir", str(tmp_path / "s"), "--exit-with-parent", str(not_parent)]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=60)
    assert done.returncode == PARENT_GONE_EXIT, done.stderr.decode()[-2000:]


def test_watch_parent_sees_a_parent_that_is_not_there() -> None:
    async def main() -> bool:
        gone = asyncio.Event()
        await asyncio.wait_for(watch_parent(os.getppid() + 1_000_000, gone), 5)
        return gone.is_set()

    assert asyncio.run(main())


def test_the_embedded_workers_token_name_is_reserved(sqlite_url: str) -> None:
    sessions = open_database(sqlite_url)
    try:
        with session_scope(sessions) as s:
            with pytest.raises(Invalid, match="name: names starting local-worker@"):
                auth.create_token(s, scopes=["admin"], name="local-worker@http://x:1")
            legacy = auth.create_token(s, scopes=["worker"], name="local-worker")[0].id
            other = auth.create_local_worker_token(s, "http://127.0.0.1:2")[0].id
            here = auth.create_local_worker_token(s, "http://127.0.0.1:1")[0].id
            revoked = auth.revoke_local_worker_tokens(s, "http://127.0.0.1:1")
            assert sorted(revoked) == sorted([legacy, here])  # another server's is left alone
            assert other not in revoked
    finally:
        bind = sessions.kw.get("bind")
        if bind is not None:
            bind.dispose()
