"""``tokentrace serve --demo`` stopped by SIGTERM or Ctrl-C (SIGINT) stops its children
too: the simulator (its port free again) and the embedded worker (issue 17)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.live_server import ROOT, free_port

pytestmark = pytest.mark.slow
START_TIMEOUT_S = 90.0  # the demo benchmarks the simulator once (100 requests) first


def _port_free(port: int) -> bool:
    """A new server could listen here: nothing listens (SO_REUSEADDR, as servers bind: the
    connections a stopped server closed may linger in TIME_WAIT without holding the port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _gone(pid: int) -> bool:
    """No such process, or only its zombie (exited, not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (Linux /proc)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = [int(k) for k in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
        for k in kids:
            out += [k, *_descendants(k)]
    return out


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"serve --demo exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"serve --demo did not answer /healthz:\n{log.read_text()[-3000:]}")


def _children_named(pid: int) -> dict[str, list[int]]:
    """The simulator and worker processes under ``pid``, by their command lines."""
    found: dict[str, list[int]] = {"simulator": [], "worker": []}
    for child in _descendants(pid):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except FileNotFoundError:
            continue
        if "app.targets.simulator" in cmd:
            found["simulator"].append(child)
        elif "app.cli.main worker" in cmd:
            found["worker"].append(child)
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_demo_stops_its_simulator_and_worker(tmp_path: Path, sig: signal.Signals) -> None:
    port, sim_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENTRACE_")}
    env |= {
        "TOKENTRACE_ALLOWED_HOSTS": "127.0.0.1",
        "TOKENTRACE_POLL_INTERVAL_S": "0.2",
        "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        "PYTHONUNBUFFERED": "1",
    }
    cmd = [
        sys.executable, "-m", "app.cli.main", "serve", "--demo",
        "--host", "127.0.0.1", "--port", str(port), "--demo-port", str(sim_port),
        "--database-url", f"sqlite:///{tmp_path / 'demo.db'}", "--log-level", "warning",
    ]  # fmt: skip
    log = tmp_path / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    pids: list[int] = []
    try:
        _wait_healthy(proc, url, log)
        deadline = time.monotonic() + 30
        kids = _children_named(proc.pid)
        while not kids["worker"] and time.monotonic() < deadline:  # supervisor thread
            time.sleep(0.2)
            kids = _children_named(proc.pid)
        pids = kids["simulator"] + kids["worker"]
        assert len(kids["simulator"]) == 1 and kids["worker"], kids
        assert not _port_free(sim_port)  # the simulator holds it

        proc.send_signal(sig)  # to the server alone, as `kill` does (not its group)
        code = proc.wait(30)
        assert code == 128 + sig, (code, log.read_text()[-3000:])
        deadline = time.monotonic() + 10
        while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p for p in pids if not _gone(p)] == [], log.read_text()[-3000:]
        assert _port_free(sim_port) and _port_free(port)
        assert "Traceback" not in log.read_text()
    finally:  # nothing of this test outlives it, whatever failed
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        for p in pids:
            if not _gone(p):
                os.kill(p, signal.SIGKILL)
