"""``tokentrace serve`` on a machine with torch runs probe jobs on its embedded worker."""

from __future__ import annotations

import time

import httpx
import pytest

from app.api.app import local_worker_kinds
from app.settings import Settings
from app.worker.capabilities import torch_version
from tests.live_server import LiveServerFactory


def test_local_worker_kinds() -> None:
    on = Settings(database_url="sqlite://")
    off = Settings(database_url="sqlite://", local_worker_probes=False)
    assert local_worker_kinds(on, torch_installed=True) == ["bench", "sweep", "probe"]
    assert local_worker_kinds(on, torch_installed=False) == ["bench", "sweep"]
    assert local_worker_kinds(off, torch_installed=True) == ["bench", "sweep"]


@pytest.mark.skipif(torch_version() is None, reason="torch is not installed (extra: probes)")
def test_serve_runs_a_cpu_probe_out_of_the_box(
    live_server: LiveServerFactory, sqlite_url: str
) -> None:
    srv = live_server(sqlite_url, local_worker=True)
    auth = {"Authorization": f"Bearer {srv.admin_token}"}
    body = {
        "kind": "linear",
        "device": "cpu",
        "name": "embedded-linear",
        "params": {"width": 16, "batch": 2, "seq": 4, "sweep_max": 2, "warmup": 1, "iters": 2},
    }
    r = httpx.post(srv.url + "/api/v1/probes", json=body, headers=auth)
    assert r.status_code in (200, 201), r.text
    probe_id = r.json()["probe_id"]
    deadline = time.monotonic() + 120
    p: dict[str, object] = {}
    while time.monotonic() < deadline:
        p = httpx.get(f"{srv.url}/api/v1/probes/{probe_id}", headers=auth).json()
        if p["status"] not in ("queued", "running"):
            break
        time.sleep(0.3)
    assert p.get("status") == "succeeded", (p, srv.log_tail())
    assert p["device_label"] == "CPU"
