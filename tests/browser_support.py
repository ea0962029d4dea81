"""A real dashboard server (uvicorn subprocess on loopback) and headless Chromium, for
tests/test_browser.py and benchmarks/screenshots.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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

    def __init__(
        self,
        db_url: str,
        log_path: Path,
        *,
        local_worker: bool = True,
        env: dict[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        extra = dict(env or {})
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
        env.update(extra)  # more TOKENTRACE_* settings
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


# ------------------------------------------------------------------ drawn charts and console

CSP_WATCH = """document.addEventListener('securitypolicyviolation', (e) => {
  (window.__csp = window.__csp || []).push(e.violatedDirective + ' ' + (e.blockedURI || 'inline'));
});"""

CHARTS_JS = """() => Array.from(document.querySelectorAll('[data-figure]')).map((d) => {
  const src = document.getElementById(d.dataset.figure);
  const fig = src ? JSON.parse(src.textContent) : null;
  return {
    id: d.id,
    expected: fig ? fig.data.length : -1,
    hidden: d.offsetParent === null,
    rendered: d.dataset.rendered === '1',
    svg: d.querySelectorAll('.main-svg').length,
    drawn: d.querySelectorAll('.plot-container .main-svg g.trace').length,
    points: d.querySelectorAll('.main-svg g.trace path, .main-svg g.trace .point').length,
    text: (d.querySelector('.main-svg') ? Array.from(d.querySelectorAll('.main-svg text'))
      .map((t) => t.textContent).join(' | ') : ''),
    webgl: /WebGL is not supported/i.test(d.textContent),
  };
})"""


class Console:
    """Console errors, page errors and CSP violations of one page (Playwright ``Page``)."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        page.add_init_script(CSP_WATCH)
        page.on("console", self._console)
        page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self._page = page

    def _console(self, msg: Any) -> None:
        if msg.type == "error":
            self.errors.append(msg.text)

    def problems(self) -> list[str]:
        """The errors so far, and the current document's CSP violations (a page that
        navigates while they are read is read again: its new document)."""
        from playwright.sync_api import Error

        for _ in range(20):
            try:
                csp = self._page.evaluate("() => window.__csp || []")
                break
            except Error as e:
                if "context was destroyed" not in str(e) and "navigat" not in str(e):
                    raise
                self._page.wait_for_load_state()
        else:
            raise AssertionError("the page kept navigating: its CSP violations unread")
        return self.errors + [f"CSP violation: {v}" for v in csp]


def submit_refused(page: Any, con: Any, selector: str, status: int = 422) -> None:
    """Submit a form the server refuses: its page comes back with ``status`` (a form with
    messages beside its fields answers 422), which Chromium logs as a failed resource
    load; that one line, and nothing else, is expected (and cleared)."""
    with page.expect_navigation() as nav:
        page.click(selector)
    resp = nav.value
    assert resp is not None and resp.status == status
    assert con.errors == [
        f"Failed to load resource: the server responded with a status of "
        f"{status} (Unprocessable Entity)"
    ], con.errors
    con.errors.clear()


def wait_js(page: Any, expr: str, timeout_ms: float = 30_000, poll_s: float = 0.05) -> Any:
    """Poll ``expr`` (``page.evaluate``) until it is truthy; its value, or Playwright's
    TimeoutError after ``timeout_ms``. Not ``page.wait_for_function``: its polling
    evaluates the predicate again by ``eval`` in the page, which the pages' CSP (no
    'unsafe-eval') refuses now and then, a console error in the test that waited
    (microsoft/playwright#7395). An evaluation cut by a navigation is tried again."""
    from playwright.sync_api import Error, TimeoutError

    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        try:
            value = page.evaluate(expr)
        except TimeoutError:
            raise
        except Error as e:  # the page navigated in the middle: its next document is polled
            if "context was destroyed" not in str(e) and "navigat" not in str(e):
                raise
            value = None
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{expr!r} still false after {timeout_ms:g} ms")
        time.sleep(poll_s)


def charts(page: Any) -> list[dict[str, Any]]:
    """Every chart div of the page once Plotly had its chance to draw the visible ones."""
    page.wait_for_load_state("load")
    with contextlib.suppress(Exception):  # not drawn in time: assert_drawn names the charts
        wait_js(
            page,
            """() => Array.from(document.querySelectorAll('[data-figure]'))
              .every((d) => d.offsetParent === null || d.querySelector('.main-svg'))""",
            timeout_ms=10_000,
        )
    out: list[dict[str, Any]] = page.evaluate(CHARTS_JS)
    return out


def assert_drawn(page: Any, expect: int | None = None) -> list[dict[str, Any]]:
    """Every visible chart of the page was drawn by Plotly as SVG: one ``g.trace`` per trace
    of its figure (at least one), or, for a figure without data, its "no data" reason; no
    WebGL fallback text. ``expect``: how many chart divs the page must have."""
    found = charts(page)
    if expect is not None:
        assert len(found) == expect, [c["id"] for c in found]
    for c in found:
        if c["hidden"]:
            continue
        assert c["rendered"] and c["svg"] > 0, f"{c['id']} not drawn: {c}"
        assert not c["webgl"], f"{c['id']}: WebGL is not supported"
        if c["expected"] > 0:
            assert c["drawn"] >= c["expected"], f"{c['id']}: {c['drawn']} of {c['expected']}"
            assert c["points"] > 0, f"{c['id']}: traces without marks"
        else:
            assert c["expected"] == 0 and "no data" in c["text"], f"{c['id']}: {c}"
    return found


def sign_in(page: Any, server: DashboardServer, secret: str, nxt: str) -> None:
    """Sign in with a token through the form, landing on ``nxt``."""
    page.goto(f"{server.url}/signin?next={nxt}")
    page.fill("#token", secret)
    with page.expect_navigation():
        page.click("#signin-form button[type=submit]")
    assert page.url.endswith(nxt), page.url
