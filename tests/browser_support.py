"""A real dashboard server (uvicorn subprocess on loopback) and headless Chromium, for
tests/test_browser.py and benchmarks/screenshots.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.live_server import free_port

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        return f"{CHROMIUM} not found (apt-get install -y chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright; no `playwright install`)"
    return None


class DashboardServer:
    """``uvicorn --factory app.api.app:create_app`` on 127.0.0.1 with its own DB."""

    def __init__(self, db_url: str, log_path: Path, *, local_worker: bool = True) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENTRACE_")}
        env.update(
            {
                "TOKENTRACE_DATABASE_URL": db_url,
                "TOKENTRACE_HOST": "127.0.0.1",
                "TOKENTRACE_PORT": str(self.port),
                "TOKENTRACE_LOCAL_WORKER": "true" if local_worker else "false",
                "TOKENTRACE_POLL_INTERVAL_S": "0.2",
                "TOKENTRACE_HEARTBEAT_INTERVAL_S": "0.5",
                "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
            }
        )
        cmd = [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "app.api.app:create_app",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "warning",
        ]
        self.log_path = log_path
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait()

    def _wait(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server did not start:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
