"""Helpers for worker tests against the real server (``tests/live_server.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]


def api(srv: Any, token: str | None = None) -> httpx.Client:
    return httpx.Client(
        base_url=srv.url + "/api/v1",
        headers={"Authorization": f"Bearer {token or srv.admin_token}"},
        timeout=30,
        trust_env=False,
    )


def sim_spec(base_url: str, **kw: Any) -> dict[str, Any]:
    return {
        "base_url": base_url,
        "model": "tokentrace-sim",
        "input_len": 16,
        "output_len": 8,
        "num_prompts": 20,
        "max_concurrency": 8,
    } | kw


def submit(c: httpx.Client, spec: dict[str, Any], **extra: Any) -> tuple[str, str]:
    r = c.post("/runs", json=spec | extra)
    assert r.status_code == 201, r.text
    body = r.json()
    return body["run_id"], body["job_id"]


def job(c: httpx.Client, job_id: str) -> dict[str, Any]:
    r = c.get(f"/jobs/{job_id}")
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


def wait_for(pred: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def wait_job(c: httpx.Client, job_id: str, states: tuple[str, ...], timeout_s: float) -> dict:  # type: ignore[type-arg]
    box: dict[str, Any] = {}

    def check() -> bool:
        r = c.get(f"/jobs/{job_id}")
        if r.status_code == 503:  # the server lost its database connection: retryable
            return False
        r.raise_for_status()
        box["job"] = r.json()
        return bool(box["job"]["state"] in states)

    deadline = time.monotonic() + timeout_s
    wait_for(check, timeout_s, f"job {job_id} in {states}")
    out: dict[str, Any] = box["job"]
    run_id = out.get("run_id")
    if out["state"] in _JOB_ENDED and run_id:
        # A job's terminal state is committed before its run is finalized (its summary is
        # computed after): wait for the run to end too, so that what follows reads it whole.
        def run_ended() -> bool:
            r = c.get(f"/runs/{run_id}")
            if r.status_code == 404:  # deleted (a forced delete while it ran)
                return True
            if r.status_code == 503:
                return False
            r.raise_for_status()
            return r.json()["run"]["status"] not in ("queued", "running")

        wait_for(
            run_ended, max(1.0, deadline - time.monotonic()), f"run {run_id} ended", poll_s=0.05
        )
    return out


_JOB_ENDED = frozenset({"succeeded", "failed", "cancelled"})


def request_indices(c: httpx.Client, run_id: str) -> list[int]:
    """Indices of every stored request of the run (duplicates would show twice)."""
    out: list[int] = []
    offset = 0
    while True:
        r = c.get(f"/runs/{run_id}/requests", params={"limit": 5000, "offset": offset})
        r.raise_for_status()
        page = r.json()
        out += [row["index"] for row in page["items"]]
        offset += len(page["items"])
        if not page["items"] or offset >= page["total"]:
            return out


def start_worker_process(
    server_url: str,
    token: str,
    state_dir: Path,
    *args: str,
    log: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """``tokentrace worker`` as a subprocess; its token in the environment (never on its
    command line, where ``ps`` shows it), plus ``env``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOKENTRACE_")}
    base["PYTHONPATH"] = str(ROOT) + os.pathsep + base.get("PYTHONPATH", "")
    base["TOKENTRACE_WORKER_TOKEN"] = token
    env = base | (env or {})
    cmd = [sys.executable, "-m", "app.cli.main", "worker", "--server", server_url]
    cmd += ["--state-dir", str(state_dir), *args]
    out = open(log or (state_dir.parent / f"{state_dir.name}.log"), "ab")  # noqa: SIM115
    try:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    finally:
        out.close()
