"""``tokentrace serve`` on a machine with torch runs probe jobs on its embedded worker."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from app.api.app import local_worker_kinds
from app.settings import Settings
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
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


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out += [int(c) for c in text]
    return out


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_embedded_worker_is_a_supervised_child_process(
    live_server: LiveServerFactory, sqlite_url: str
) -> None:
    """The embedded worker runs in its own process: killing it (as a run exhausting its
    memory or descriptors would) leaves the server up, and the server starts it again, so
    jobs still run."""
    srv = live_server(sqlite_url, local_worker=True)
    assert srv.proc is not None
    deadline = time.monotonic() + 30
    workers: list[int] = []
    while time.monotonic() < deadline and not workers:
        workers = _children(srv.proc.pid)
        time.sleep(0.1)
    assert len(workers) == 1, srv.log_tail()
    cmdline = Path(f"/proc/{workers[0]}/cmdline").read_bytes().split(b"\0")
    assert b"worker" in cmdline and not any(b"tt_" in a for a in cmdline)  # no token in argv
    os.kill(workers[0], signal.SIGKILL)
    restarted: list[int] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        restarted = [p for p in _children(srv.proc.pid) if p != workers[0]]
        if restarted:
            break
        time.sleep(0.1)
    assert restarted, srv.log_tail()
    assert httpx.get(srv.url + "/healthz").status_code == 200
    with start_simulator_thread(SimConfig(ttft_ms=2, itl_ms=1, seed=1)) as sim:
        auth = {"Authorization": f"Bearer {srv.admin_token}"}
        spec = {"base_url": sim.base_url, "model": "m", "num_prompts": 3, "input_len": 8,
                "output_len": 4}  # fmt: skip
        r = httpx.post(srv.url + "/api/v1/runs", json=spec, headers=auth)
        assert r.status_code == 201, r.text
        run_id = r.json()["run_id"]
        status = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            run = httpx.get(f"{srv.url}/api/v1/runs/{run_id}", headers=auth).json()["run"]
            status = run["status"]
            if status not in ("queued", "running"):
                break
            time.sleep(0.2)
    assert status == "succeeded", srv.log_tail()
