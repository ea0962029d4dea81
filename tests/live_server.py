"""``live_server``: ``tokentrace serve`` as a real subprocess, for tests over real HTTP.

    def test_x(live_server, sqlite_url):
        srv = live_server(sqlite_url)               # started, /healthz answered
        httpx.get(srv.url + "/api/v1/runs")
        srv.kill(); srv.restart()                   # SIGKILL, then the same port and DB

``live_server(db_url, *, local_worker=False, env=None)`` returns a ``LiveServer`` with
``.url``, ``.admin_token`` and ``.worker_token`` (created in the database before start),
``.create_token(*scopes)``, ``.stop()``, ``.kill()``, ``.restart()`` and ``.log_path``.
Extra ``TOKENTRACE_*`` settings go in ``env`` (e.g. ``{"TOKENTRACE_LEASE_TTL_S": "2"}``).
Every server still running is stopped at the end of the test (``module_live_server``: of
the module, for servers its tests share).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from app.services import auth
from app.services.runs import open_database
from app.storage.db import session_scope

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def make_token(db_url: str, *scopes: str, name: str | None = None) -> str:
    """A token secret with ``scopes``, created directly in the database."""
    sessions = open_database(db_url)
    try:
        with session_scope(sessions) as s:
            _, secret = auth.create_token(s, scopes=list(scopes), name=name or "test")
    finally:
        bind = sessions.kw.get("bind")
        if bind is not None:
            bind.dispose()
    return secret


class LiveServer:
    def __init__(
        self,
        db_url: str,
        log_dir: Path,
        *,
        local_worker: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:
        self.db_url = db_url
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.local_worker = local_worker
        self.extra_env = dict(env or {})
        self.log_path = log_dir / f"server-{self.port}.log"
        self.admin_token = make_token(db_url, "admin", name="live-server-admin")
        self.worker_token = make_token(db_url, "worker", name="live-server-worker")
        self.proc: subprocess.Popen[bytes] | None = None
        self._starts = 0

    def create_token(self, *scopes: str, name: str | None = None) -> str:
        return make_token(self.db_url, *scopes, name=name)

    def start(self) -> LiveServer:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("the server is already running")
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENTRACE_")}
        env.update(
            {
                "TOKENTRACE_DATABASE_URL": self.db_url,
                "TOKENTRACE_HOST": "127.0.0.1",
                "TOKENTRACE_PORT": str(self.port),
                "TOKENTRACE_LOCAL_WORKER": "true" if self.local_worker else "false",
                "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.extra_env)
        cmd = [sys.executable, "-m", "app.cli.main", "serve", "--log-level", "warning"]
        self._starts += 1
        log = self.log_path.open("ab")
        log.write(f"--- start {self._starts}: {' '.join(cmd)}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self._wait_healthy()
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the server exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            try:
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"the server did not answer /healthz in time:\n{self.log_tail()}")

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (uvicorn shuts down cleanly), then SIGKILL after ``timeout_s``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (leases stay as they were)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.kill()
        self.proc.wait(10)

    def restart(self) -> LiveServer:
        """Stop (if running) and start again on the same port and database."""
        self.stop()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # wait until the port is free again
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", self.port))
                    break
                except OSError:
                    time.sleep(0.1)
        return self.start()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


LiveServerFactory = Callable[..., LiveServer]


def _servers(log_dir: Path) -> Iterator[LiveServerFactory]:
    servers: list[LiveServer] = []

    def start(
        db_url: str, *, local_worker: bool = False, env: dict[str, str] | None = None
    ) -> LiveServer:
        srv = LiveServer(db_url, log_dir, local_worker=local_worker, env=env)
        servers.append(srv)
        return srv.start()

    yield start
    for srv in servers:
        srv.stop(timeout_s=10)


@pytest.fixture
def live_server(tmp_path: Path) -> Iterator[LiveServerFactory]:
    """A factory: ``live_server(db_url, local_worker=False, env=None)`` -> a started server."""
    yield from _servers(tmp_path)


@pytest.fixture(scope="module")
def module_live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServerFactory]:
    """``live_server`` for a module's tests to share (servers stopped after its last test)."""
    yield from _servers(tmp_path_factory.mktemp("live-servers"))
