"""What every page needs: the Jinja environment, the database, the settings and the signed-in
principal (an API token kept in an HttpOnly cookie)."""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anyio.to_thread
from fastapi import Request, Response
from fastapi.responses import RedirectResponse
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader
from markupsafe import Markup
from sqlalchemy.orm import Session, sessionmaker

from app import __version__
from app.analysis.metric_defs import format_relative, format_signed, format_value, metric
from app.services import web_sessions
from app.services.auth import Principal
from app.settings import Settings
from app.storage.db import session_scope
from app.web.assets import static_url

COOKIE = "tt_session"  # a sign-in session's secret (app.services.web_sessions)
CSRF_COOKIE = "tt_csrf"  # the sign-in form's CSRF token (there is no session yet)
ROOT = Path(__file__).resolve().parents[2]
_PACKAGED = Path(__file__).resolve().parent / "_assets"


_T = TypeVar("_T")


async def off_loop(fn: Callable[..., _T], *args: Any) -> _T:
    """Run ``fn(*args)`` (a database write, above all) in a worker thread. A form handler is
    async to read its body, but a write that waits for a lock on the event loop also stops
    the request holding that lock from committing (its session closes through the loop):
    both wait out the busy timeout on SQLite, for ever on PostgreSQL."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args))


def asset_dir(name: str) -> Path:
    """``templates`` or ``static``: the packaged copy if present, else the checkout's."""
    packaged = _PACKAGED / name
    return packaged if packaged.is_dir() else ROOT / name


# ----------------------------------------------------------------------- formatting


def fmt_num(v: Any, digits: int = 1) -> str:
    """A number for a table cell, always with ``digits`` decimals and thousands separators
    (one rule per column: every cell of it has the same decimals); an em dash for
    None/NaN."""
    if v is None or isinstance(v, bool):
        return "—" if v is None else str(v)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if not math.isfinite(f):
        return "—"
    return f"{f:,.{digits}f}"


MS_DECIMALS = 2  # every latency in ms: sub-millisecond ITL/TPOT stay visible


def fmt_ms(v: Any) -> str:
    """A latency in ms: ``MS_DECIMALS`` decimals whatever its size."""
    return fmt_num(v, MS_DECIMALS)


def fmt_pct(v: Any) -> str:
    if v is None:
        return "—"
    return f"{float(v) * 100:.1f}%"


def _as_utc(v: Any) -> dt.datetime | None:
    if isinstance(v, str):
        try:
            v = dt.datetime.fromisoformat(v)
        except ValueError:
            return None
    if not isinstance(v, dt.datetime):
        return None
    return v.replace(tzinfo=dt.UTC) if v.tzinfo is None else v.astimezone(dt.UTC)


def fmt_dt(v: Any) -> Markup | str:
    """A timestamp as ``<time datetime="…Z" title="… UTC">… UTC</time>``: UTC in the page
    (and on hover); static/app.js rewrites the text to the viewer's local time and zone.
    Stored times are UTC (naive ones are taken as UTC); an em dash for none."""
    if v is None:
        return "—"
    t = _as_utc(v)
    if t is None:
        return str(v)
    text = t.strftime("%Y-%m-%d %H:%M:%S UTC")
    iso = t.strftime("%Y-%m-%dT%H:%M:%SZ")
    return Markup('<time datetime="{}" title="{}">{}</time>').format(iso, text, text)


_IP_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[0-9.]+)(:\d+)?$")


def _host_markup(netloc: str) -> Markup:
    """A host that breaks only after a dot of a DNS name, never inside a label, an IP
    address or before its port: each label is a ``nowrap`` span."""
    if _IP_HOST.match(netloc):
        return Markup('<span class="host ip">{}</span>').format(netloc)
    labels = Markup(".<wbr>").join(Markup("<span>{}</span>").format(x) for x in netloc.split("."))
    return Markup('<span class="host">{}</span>').format(labels)


def fmt_url(v: Any) -> Markup | str:
    """A URL for a narrow cell: it may break after ``//``, after a dot of the host name and
    before each path ``/`` or the ``?``; never inside a host label, an IP address or a
    port (``_host_markup``); the whole URL is the title. Text that is not an absolute URL
    shows as it is; an em dash for none."""
    if v is None or v == "":
        return "—"
    text = str(v)
    try:
        parts = urlsplit(text)
    except ValueError:
        return text
    if not parts.scheme or not parts.netloc:
        return text
    first, *more = parts.path.split("/")
    rest = Markup("{}").format(first)
    for seg in more:
        rest += Markup("<wbr>/{}").format(seg)
    if parts.query:
        rest += Markup("<wbr>?{}").format(parts.query)
    if parts.fragment:
        rest += Markup("#{}").format(parts.fragment)
    return Markup('<span class="url" title="{}">{}://<wbr>{}{}</span>').format(
        text, parts.scheme, _host_markup(parts.netloc), rest
    )


def make_templates() -> Jinja2Templates:
    env = Environment(
        loader=FileSystemLoader(str(asset_dir("templates"))),
        autoescape=True,  # every template: names, notes and errors show escaped
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = fmt_num
    env.filters["ms"] = fmt_ms
    env.filters["pct"] = fmt_pct
    env.filters["dt"] = fmt_dt
    env.filters["url"] = fmt_url
    env.globals["version"] = __version__
    env.globals["static_url"] = static_url  # hashed /static URLs (app.web.assets)
    env.globals["metric_label"] = metric  # names and units (app.analysis.metric_defs)
    env.filters["metric"] = format_value  # {{ v | metric('ttft_ms') }}
    env.filters["signed"] = format_signed  # {{ d | signed('ttft_ms') }} -> "+1.23 ms"
    env.filters["rel"] = format_relative  # {{ r | rel }} -> "+12.3%"
    return Jinja2Templates(env=env)


templates = make_templates()


# ----------------------------------------------------------------------- app state


def sessions_of(request: Request) -> sessionmaker[Session]:
    sessions: sessionmaker[Session] = request.app.state.sessions
    return sessions


def settings_of(request: Request) -> Settings:
    settings = getattr(request.app.state, "settings", None)
    return settings if isinstance(settings, Settings) else Settings()


_UNKNOWN = object()


def _signed_in(request: Request) -> web_sessions.SignedIn | None:
    """The live session of the sign-in cookie (looked up once per request)."""
    cached = getattr(request.state, "signed_in", _UNKNOWN)
    if cached is not _UNKNOWN:
        return cached if isinstance(cached, web_sessions.SignedIn) else None
    secret = request.cookies.get(COOKIE)
    found = None
    if secret:
        with session_scope(sessions_of(request)) as s:
            found = web_sessions.signed_in(s, secret)
    request.state.signed_in = found
    return found


def principal_of(request: Request) -> Principal | None:
    """The principal of the sign-in session in the cookie, if it is live."""
    found = _signed_in(request)
    return found.principal if found is not None else None


def csrf_token(request: Request) -> str:
    """The CSRF token forms on this page carry: the session's, or (signed out) the sign-in
    form's from its cookie (``signin_page`` sets it)."""
    found = _signed_in(request)
    if found is not None:
        return found.csrf
    return request.cookies.get(CSRF_COOKIE) or str(getattr(request.state, "new_csrf", ""))


def same_origin(request: Request) -> bool:
    """A state-changing form post must come from this site's own pages: its ``Origin`` (or,
    without one, its ``Referer``) names this server's scheme and host."""
    own = f"{request.url.scheme}://{request.headers.get('host', '')}".lower()
    origin = request.headers.get("origin")
    if origin is not None:
        return origin.lower() == own
    referer = (request.headers.get("referer") or "").lower()
    return referer == own or referer.startswith(own + "/")


def csrf_ok(request: Request, values: dict[str, str]) -> bool:
    """Same origin, and the form's ``csrf`` field is this session's (or the sign-in
    cookie's) token."""
    return same_origin(request) and web_sessions.same_token(
        values.get("csrf") or "", csrf_token(request)
    )


def reads_allowed(request: Request, principal: Principal | None) -> bool:
    """Pages are open unless the server protects reads (``auth_reads``)."""
    if not settings_of(request).auth_reads:
        return True
    return principal is not None and principal.has("read")


def read_gate(request: Request) -> tuple[Principal | None, Response | None]:
    """The signed-in principal, and a redirect to sign-in when reads need a token."""
    principal = principal_of(request)
    if reads_allowed(request, principal):
        return principal, None
    return principal, RedirectResponse(f"/signin?next={request.url.path}", status_code=303)


def render(
    request: Request,
    name: str,
    ctx: dict[str, Any],
    *,
    principal: Principal | None = None,
    status_code: int = 200,
) -> Response:
    base = {"principal": principal, "nav": ctx.pop("nav", ""), "csrf": csrf_token(request)}
    resp: Response = templates.TemplateResponse(request, name, base | ctx, status_code=status_code)
    return resp


def render_form(
    request: Request,
    template: str,
    *,
    nav: str,
    fields: Any,
    groups: Any,
    values: dict[str, str],
    errors: dict[str, str],
    principal: Principal | None,
    status_code: int | None = None,
    dataset_groups: Any = (),
    endpoint_groups: Any = (),
    extra: dict[str, Any] | None = None,
) -> Response:
    """A launch form page (run, sweep, probe): its fields by group, the values shown, the
    messages beside fields, and whether the principal may submit (the ``run`` scope);
    ``dataset_groups``, ``endpoint_groups``: each dataset type's and endpoint's own option
    fields (run and sweep forms); ``extra``: more of the template's context (the series
    picker's names).
    Status: ``status_code`` when given, else 422 with messages and 200 without."""
    return render(
        request,
        template,
        {
            "nav": nav,
            "fields": fields,
            "groups": groups,
            "values": values,
            "errors": errors,
            "dataset_groups": dataset_groups,
            "endpoint_groups": endpoint_groups,
            "can_run": principal is not None and principal.has("run"),
        }
        | (extra or {}),
        principal=principal,
        status_code=status_code if status_code is not None else (422 if errors else 200),
    )
