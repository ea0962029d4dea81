"""Failed sign-ins and bearer-token checks are limited per client address (issue 23, item 9:
300 wrong tokens in 2.7 s were all checked). After ``auth_max_failures`` in the window the
address gets 429 with ``Retry-After``, its attempts not even checked; other addresses and
successful sign-ins are unaffected; the memory it takes is bounded. Over real HTTP, with
loopback source addresses 127.0.0.x standing for different clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest

from app.services.auth import FailureLimiter, client_key
from tests.api_support import api_client
from tests.live_server import LiveServer, LiveServerFactory
from tests.web_support import post_form

MAX_FAILURES = 5
WINDOW_S = 600  # longer than the test: nothing expires while it runs


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_window_blocks_then_expires() -> None:
    clock = FakeClock()
    lim = FailureLimiter(max_failures=3, window_s=60, max_clients=10, clock=clock)
    for _ in range(2):
        lim.failed("10.0.0.1")
        assert lim.retry_after("10.0.0.1") is None
    clock.now += 10
    lim.failed("10.0.0.1")  # the third, 10 s into the window
    assert lim.retry_after("10.0.0.1") == 50
    clock.now += 49.5
    assert lim.retry_after("10.0.0.1") == 1  # whole seconds, rounded up
    assert lim.retry_after("10.0.0.2") is None  # another client
    clock.now += 0.5
    assert lim.retry_after("10.0.0.1") is None  # the window is over
    lim.failed("10.0.0.1")  # a new window, with one failure
    assert lim.retry_after("10.0.0.1") is None


def test_memory_is_bounded_whatever_the_callers() -> None:
    lim = FailureLimiter(max_failures=3, window_s=60, max_clients=100, clock=FakeClock())
    for i in range(20_000):
        lim.failed(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}")
        assert len(lim) <= 100
    for _ in range(3):
        lim.failed("192.0.2.1")
    assert lim.retry_after("192.0.2.1") is not None  # the newest are kept


def test_an_ipv6_host_counts_as_its_64() -> None:
    assert (
        client_key("2001:db8:1:2::1") == client_key("2001:db8:1:2:ffff::9") == ("2001:db8:1:2::/64")
    )
    assert client_key("2001:db8:1:3::1") != client_key("2001:db8:1:2::1")
    assert client_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert client_key(None) == "unknown"


@pytest.fixture
def server(live_server: LiveServerFactory, sqlite_url: str) -> LiveServer:
    return live_server(
        sqlite_url,
        env={
            "TOKENTRACE_AUTH_MAX_FAILURES": str(MAX_FAILURES),
            "TOKENTRACE_AUTH_FAILURE_WINDOW_S": str(WINDOW_S),
        },
    )


ClientAt = Callable[[str], httpx.Client]


@pytest.fixture
def client_at(server: LiveServer) -> Iterator[ClientAt]:
    """``client_at("127.0.0.2")``: a client whose connections come from that address."""
    made: dict[str, httpx.Client] = {}

    def client(source: str) -> httpx.Client:
        if source not in made:
            transport = httpx.HTTPTransport(local_address=source)
            made[source] = httpx.Client(base_url=server.url, transport=transport, timeout=30)
        return made[source]

    yield client
    for c in made.values():
        c.close()


def _sign_in(c: httpx.Client, token: str) -> httpx.Response:
    c.cookies.clear()
    return post_form(c, "/signin", {"token": token, "next": "/"}, follow_redirects=False)


@pytest.mark.slow
def test_sign_in_is_limited_per_address(server: LiveServer, client_at: ClientAt) -> None:
    a, b = client_at("127.0.0.2"), client_at("127.0.0.3")
    for _ in range(MAX_FAILURES):
        assert _sign_in(a, "tt_wrong").status_code == 401
    r = _sign_in(a, "tt_wrong")
    assert r.status_code == 429 and "too many failed sign-ins" in r.text
    assert 1 <= int(r.headers["Retry-After"]) <= WINDOW_S
    assert _sign_in(a, server.admin_token).status_code == 429  # not even checked
    # another address: its own count, and a right token signs in
    assert _sign_in(b, "tt_wrong").status_code == 401
    ok = _sign_in(b, server.admin_token)
    assert ok.status_code == 303 and "tt_session" in ok.cookies


@pytest.mark.slow
def test_successful_sign_ins_neither_count_nor_reset(
    server: LiveServer, client_at: ClientAt
) -> None:
    c = client_at("127.0.0.4")
    for _ in range(MAX_FAILURES - 1):
        assert _sign_in(c, "tt_wrong").status_code == 401
    for _ in range(3 * MAX_FAILURES):
        assert _sign_in(c, server.admin_token).status_code == 303
    assert _sign_in(c, "tt_wrong").status_code == 401  # the fifth failure
    assert _sign_in(c, "tt_wrong").status_code == 429


@pytest.mark.slow
def test_bearer_tokens_are_limited_per_address_and_300_guesses_get_5_checks(
    server: LiveServer, client_at: ClientAt
) -> None:
    a, b = client_at("127.0.0.5"), client_at("127.0.0.6")
    codes = [
        a.get("/api/v1/tokens", headers={"Authorization": f"Bearer tt_guess{i}"}).status_code
        for i in range(300)
    ]
    assert codes.count(401) == MAX_FAILURES and codes.count(429) == 300 - MAX_FAILURES
    r = a.get("/api/v1/tokens", headers={"Authorization": f"Bearer {server.admin_token}"})
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert "too many failed token checks" in r.json()["detail"]
    assert _sign_in(a, server.admin_token).status_code == 429  # one count per address
    assert a.get("/api/v1/runs").status_code == 200  # no token sent: an open read
    ok = b.get("/api/v1/tokens", headers={"Authorization": f"Bearer {server.admin_token}"})
    assert ok.status_code == 200


def test_the_read_gate_counts_unknown_bearer_tokens_not_tokens_without_the_scope(
    sqlite_url: str,
) -> None:
    with api_client(sqlite_url, auth_reads=True, auth_max_failures=3) as api:
        for _ in range(10):  # a real token without 'read' (a misconfigured scraper)
            assert api.client.get("/metrics", headers=api.h(api.worker)).status_code == 401
        assert api.client.get("/metrics", headers=api.h(api.read)).status_code == 200
        for _ in range(3):
            assert api.client.get("/metrics", headers=api.h("tt_guess")).status_code == 401
        r = api.client.get("/metrics", headers=api.h(api.read))
        assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
        assert api.client.get("/api/v1/runs", headers=api.h(api.read)).status_code == 429
