"""``docker compose up --scale worker=N`` as written (issue 26 part 6), checked statically
(no docker engine runs in the test environment): the ``worker`` service exists, starts none
by default, and nothing in it stops N copies running side by side (no container name, no
published port, no shared volume); its command is a valid ``tokentrace worker``
invocation."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.test_interop_service import _tokentrace_args

ROOT = Path(__file__).resolve().parents[1]


def test_the_worker_service_scales() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    w = services["worker"]
    assert "profiles" not in w  # --scale needs no profile
    assert w["deploy"]["replicas"] == 0  # `docker compose up` alone starts none
    for one_per_host in ("container_name", "ports", "volumes", "hostname"):
        assert one_per_host not in w, one_per_host
    assert w["image"] == services["web"]["image"]
    assert w["depends_on"]["web"]["condition"] == "service_healthy"
    assert w["environment"]["TOKENTRACE_WORKER_TOKEN"].startswith("${TOKENTRACE_WORKER_TOKEN")
    cmd = w["command"]
    # the dashboard of this compose project, or another machine's (TOKENTRACE_SERVER)
    assert cmd[0] == "worker"
    assert cmd[cmd.index("--server") + 1] == "${TOKENTRACE_SERVER:-http://web:8000}"
    _tokentrace_args(cmd)
