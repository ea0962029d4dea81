"""Cookie-authenticated forms resist cross-site requests: a per-session CSRF token and an
Origin/Referer check on every state-changing form (sign-in included), and a cookie that
holds an expiring, revocable session id, not the API token."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, func, select, text, update

from app.storage.models import Job, WebSession
from tests.api_support import Api, api_client
from tests.web_support import csrf_of, post_form, sign_in

FORM = {"base_url": "http://127.0.0.1:9", "model": "m", "num_prompts": "2", "endpoint": "chat"}


@pytest.fixture
def web(sqlite_url: str) -> Iterator[Api]:
    with api_client(sqlite_url) as a:
        yield a


def _jobs(a: Api) -> int:
    engine = create_engine(a.db_url)
    try:
        with engine.connect() as c:
            return int(c.execute(select(func.count()).select_from(Job)).scalar_one())
    finally:
        engine.dispose()


def test_cross_site_form_posts_are_refused(web: Api) -> None:
    c = web.client
    assert sign_in(c, web.run, "/launch").status_code == 303
    token = csrf_of(c, "/launch")
    own = str(c.base_url).rstrip("/")
    # a page on another origin (another port of the same host, a sibling sub-domain)
    for origin in ("http://testserver:8081", "http://evil.example"):
        r = c.post("/launch", data=FORM | {"csrf": token}, headers={"Origin": origin})
        assert r.status_code == 403 and "CSRF" in r.text
    r = c.post("/launch", data=FORM, headers={"Origin": own})  # no token
    assert r.status_code == 403
    r = c.post("/launch", data=FORM | {"csrf": token})  # neither Origin nor Referer
    assert r.status_code == 403
    assert _jobs(web) == 0
    ok = c.post(
        "/launch", data=FORM | {"csrf": token}, headers={"Referer": own + "/launch"},
        follow_redirects=False,
    )  # fmt: skip
    assert ok.status_code == 303 and _jobs(web) == 1


def test_login_csrf_is_refused(web: Api) -> None:
    """A cross-site POST to /signin (no CSRF cookie from our sign-in page, another origin)
    must not swap the victim's session for the attacker's token."""
    c = web.client
    r = c.post(
        "/signin", data={"token": web.admin, "csrf": "forged"},
        headers={"Origin": "http://evil.example"}, follow_redirects=False,
    )  # fmt: skip
    assert r.status_code == 403 and "tt_session" not in r.headers.get("set-cookie", "")
    r = c.post(
        "/signin", data={"token": web.admin, "csrf": "forged"},
        headers={"Origin": str(c.base_url).rstrip("/")}, follow_redirects=False,
    )  # fmt: skip
    assert r.status_code == 403  # same origin but no matching CSRF cookie
    assert sign_in(c, web.admin).status_code == 303  # from our own sign-in page it works


def test_session_cookie_is_not_the_token_and_sign_out_revokes_it(web: Api) -> None:
    c = web.client
    r = sign_in(c, web.run, "/launch")
    session = c.cookies.get("tt_session")
    assert session and web.run not in session and web.run not in r.headers["set-cookie"]
    assert 'id="signin-needed"' not in c.get("/launch").text
    assert post_form(c, "/signout", {}).status_code in (200, 303)
    c.cookies.set("tt_session", session)  # a copy of the old cookie (stolen, or cached)
    assert 'id="signin-needed"' in c.get("/launch").text


def test_sessions_expire_and_die_with_their_token(web: Api) -> None:
    c = web.client
    sign_in(c, web.run)
    assert 'id="signin-needed"' not in c.get("/launch").text
    engine = create_engine(web.db_url)
    try:
        with engine.begin() as conn:
            past = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)
            conn.execute(update(WebSession).values(expires_at=past))
        assert 'id="signin-needed"' in c.get("/launch").text  # expired
        sign_in(c, web.run)
        assert 'id="signin-needed"' not in c.get("/launch").text
        with engine.begin() as conn:
            conn.execute(text("UPDATE api_tokens SET revoked_at = CURRENT_TIMESTAMP"))
        assert 'id="signin-needed"' in c.get("/launch").text  # its token was revoked
    finally:
        engine.dispose()
