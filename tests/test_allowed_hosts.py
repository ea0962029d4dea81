"""``TOKENTRACE_ALLOWED_HOSTS``: requests whose ``Host`` header names another host get 400
and reach no route (issue 14, item 11). Without it a page on ``http://rebind.attacker``
whose name a DNS-rebinding attack points at 127.0.0.1 could read the dashboard and API
from the victim's browser. Default: the bind host, the public URL's host, ``localhost``,
``127.0.0.1``, ``[::1]`` (and this machine's name when bound to every interface).

The suite's other tests run with ``testserver`` (the TestClient's Host) allowed: see
``tests/conftest.py``."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.api.app import create_app
from app.settings import Settings


@contextmanager
def client(sqlite_url: str, **settings: Any) -> Iterator[TestClient]:
    cfg = Settings(database_url=sqlite_url, local_worker=False, **settings)
    with TestClient(create_app(cfg), base_url="http://127.0.0.1:8000") as c:
        yield c


def _status(c: TestClient, host: str, path: str = "/healthz") -> int:
    return c.get(path, headers={"host": host}).status_code


def test_default_allows_loopback_names_only(sqlite_url: str) -> None:
    with client(sqlite_url, allowed_hosts=[]) as c:
        for host in ("127.0.0.1:8000", "localhost", "LOCALHOST:8000", "[::1]:8000", "localhost."):
            assert _status(c, host) == 200, host
        for host in ("rebind.attacker", "rebind.attacker:8000", "127.0.0.1.nip.io", "testserver"):
            assert _status(c, host) == 400, host
        r = c.get("/api/v1/runs", headers={"host": "rebind.attacker"})
        assert r.status_code == 400
        assert "rebind.attacker" in r.json()["detail"]
        assert "TOKENTRACE_ALLOWED_HOSTS" in r.json()["detail"]
        assert _status(c, "rebind.attacker", "/") == 400  # pages too
        assert _status(c, "rebind.attacker", "/metrics") == 400


def test_public_url_and_bind_host_are_allowed(sqlite_url: str) -> None:
    with client(
        sqlite_url, allowed_hosts=[], host="10.1.2.3", public_url="https://bench.lab.example/"
    ) as c:
        assert _status(c, "bench.lab.example") == 200
        assert _status(c, "10.1.2.3:8000") == 200
        assert _status(c, "localhost:8000") == 200
        assert _status(c, "other.lab.example") == 400


def test_bound_to_every_interface_allows_this_machines_name(sqlite_url: str) -> None:
    with client(sqlite_url, allowed_hosts=[], host="0.0.0.0") as c:
        assert _status(c, socket.gethostname()) == 200
        assert _status(c, "0.0.0.0:8000") == 400  # not a name a browser should use
        assert _status(c, "rebind.attacker") == 400


def test_explicit_list_with_patterns(sqlite_url: str) -> None:
    with client(sqlite_url, allowed_hosts=["*.gpu.example", "dash.example", "[fd00::1]"]) as c:
        assert _status(c, "a.gpu.example") == 200
        assert _status(c, "dash.example:443") == 200
        assert _status(c, "[fd00::1]:8000") == 200
        assert _status(c, "gpu.example") == 400  # the pattern names sub-domains
        assert _status(c, "evil-dash.example") == 400
        assert _status(c, "127.0.0.1:8000") == 200  # the server's own URL (embedded worker)
        assert _status(c, "localhost") == 400  # an explicit list is the whole list
    with client(sqlite_url, allowed_hosts=["*"]) as c:
        assert _status(c, "anything.example") == 200


def test_environment_variable(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENTRACE_ALLOWED_HOSTS", "dash.example, *.gpu.example")
    assert Settings().allowed_hosts == ["dash.example", "*.gpu.example"]
    monkeypatch.setenv("TOKENTRACE_ALLOWED_HOSTS", "")
    assert Settings().allowed_hosts == []
