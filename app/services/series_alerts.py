"""Alerts of a series: rules, raised as runs settle, delivered to a webhook off the request
path with retries and back-off; every delivery's attempts and last error are kept and
shown.

**A rule** follows one metric/statistic of a series: an absolute threshold (``max_value``:
a value worse than it breaks it; "worse" by ``Metric.better``), a relative one
(``max_relative``: worse than the series' baseline value by more than this fraction; the
baseline is the series' baseline run when one is set, else its first counted run on the
track), and/or its change points. It judges only runs that settle after it was made, that
match the series' key and can be trusted.

**The webhook** must be an http(s) URL that passes the checks a run's ``base_url`` does
(``app.client.url_checks.checked_url``; ``app.services.targets``: not this dashboard, not a
link-local address, in the operator's allow-list), checked when the rule is made and again,
with the host's resolved addresses, before each delivery. It is stored sealed
(``SecretBox``: a Slack webhook URL is a secret) and shown as scheme, host and port.

**Delivery** (``deliver_due``, run by the dashboard's alert loop and after a CLI run): a
JSON POST with a Slack-compatible ``text`` field and the alert's facts. A 2xx answer
delivers it; anything else is retried after ``alert_retry_s``, doubled each time, until
``alert_max_attempts``, then it is ``failed``. An event is claimed before it is sent (its
next try moved ahead), so two processes do not send it together. Nothing here runs in a
run's finalize: settling only marks members to judge.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import ipaddress
import json
import logging
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from app.analysis import series as sa
from app.analysis.metric_defs import format_value
from app.client.url_checks import checked_url
from app.services import series as series_svc
from app.services import targets
from app.services.errors import Invalid, NotFound
from app.services.secretbox import SecretBox
from app.settings import Settings
from app.storage import series as series_repo
from app.storage.db import session_scope
from app.storage.models import utcnow
from app.storage.models_series import SeriesAlert, SeriesAlertEvent

log = logging.getLogger(__name__)

CLAIM_S = 60.0  # a claimed event is due again after this if its sender died
MAX_BACKOFF_S = 3600.0
ERROR_CHARS = 300
USER_AGENT = "tokentrace-alerts"


# ---------------------------------------------------------------------------- webhooks


def shown_url(url: str) -> str:
    """``scheme://host[:port]/…``: enough to recognise a webhook, nothing of its secret."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}/…"


def check_webhook(url: str, settings: Settings, *, field: str = "webhook") -> str:
    """``url`` when it may receive alerts, else ``Invalid`` (422) naming ``field``."""
    try:
        checked_url(field, url)
    except ValueError as e:
        raise Invalid(str(e), loc=("body", field)) from None
    targets.check_target(url, settings.target_allowlist, field=field, settings=settings)
    return url


def resolved_refusal(url: str, settings: Settings) -> str | None:
    """Why the webhook may not be called now: a resolved address of its host is link-local
    or this dashboard itself (``targets.refusal``), or the host does not resolve."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        return f"{host} does not resolve: {e}"
    for info in infos:
        ip = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        literal = f"[{ip}]" if ip.version == 6 else str(ip)
        why = targets.refusal(f"{parts.scheme}://{literal}:{port}/", settings)
        if why is not None:
            return f"{host} resolves to {ip}, which {why}"
    return None


# ------------------------------------------------------------------------------- rules


def rule_dict(rule: SeriesAlert) -> dict[str, Any]:
    ref = sa.MetricRef(rule.metric, rule.stat)
    return {
        "id": rule.id,
        "metric": rule.metric,
        "stat": rule.stat,
        "metric_text": ref.text,
        "label": ref.label,
        "webhook": rule.webhook_shown,
        "max_value": rule.max_value,
        "max_relative": rule.max_relative,
        "change_points": rule.change_points,
        "created_at": rule.created_at.isoformat(),
    }


def event_dict(e: SeriesAlertEvent) -> dict[str, Any]:
    return {
        "id": e.id,
        "alert_id": e.alert_id,
        "run_id": e.run_id,
        "kind": e.kind,
        "text": e.text,
        "state": e.state,
        "attempts": e.attempts,
        "next_attempt_at": e.next_attempt_at.isoformat() if e.next_attempt_at else None,
        "last_error": e.last_error,
        "created_at": e.created_at.isoformat(),
        "delivered_at": e.delivered_at.isoformat() if e.delivered_at else None,
    }


def add_rule(
    s: Session,
    settings: Settings,
    box: SecretBox,
    name: str,
    *,
    metric: str,
    webhook: str,
    max_value: float | None = None,
    max_relative: float | None = None,
    change_points: bool = True,
) -> dict[str, Any]:
    """A new alert rule of the series (422 naming the field on bad input)."""
    row = series_svc.get(s, name)
    ref = series_svc.parse_ref(metric, loc=("body", "metric"))
    check_webhook(webhook, settings)
    for field, v in (("max_value", max_value), ("max_relative", max_relative)):
        if v is not None and not (v == v and abs(v) != float("inf")):
            raise Invalid(f"{field} must be a finite number", loc=("body", field))
    if max_relative is not None and not 0 < max_relative <= 100:
        raise Invalid("max_relative must be a fraction in (0, 100]", loc=("body", "max_relative"))
    if max_value is None and max_relative is None and not change_points:
        raise Invalid(
            "an alert needs a threshold (max_value, max_relative) or change_points",
            loc=("body", "change_points"),
        )
    rule = series_repo.add_alert(
        s,
        series_id=row.id,
        metric=ref.key,
        stat=ref.stat,
        webhook_sealed=box.seal(webhook),
        webhook_shown=shown_url(webhook),
        max_value=max_value,
        max_relative=max_relative,
        change_points=change_points,
    )
    return rule_dict(rule)


def rules(s: Session, name: str, *, events: int = 50) -> dict[str, Any]:
    row = series_svc.get(s, name)
    return {
        "alerts": [rule_dict(r) for r in series_repo.alerts(s, row.id)],
        "events": [event_dict(e) for e in series_repo.events(s, row.id, limit=events)],
    }


def delete_rule(s: Session, name: str, alert_id: int) -> None:
    row = series_svc.get(s, name)
    if not series_repo.delete_alert(s, row.id, alert_id):
        raise NotFound(f"series {name!r} has no alert {alert_id}")


# ---------------------------------------------------------------------------- raising


def _fmt(ref: sa.MetricRef, v: float | None) -> str:
    if v is None:
        return "—"
    if ref.key == sa.ERROR_RATE:
        return f"{v * 100:.1f}%"
    return format_value(v, ref.key, with_unit=True)


def _where(ref: sa.MetricRef, track: str) -> str:
    return ref.label + (f" at {track}" if track else "")


def _threshold_text(series: str, ref: sa.MetricRef, track: str, m: sa.Member,
                    value: float, why: list[str]) -> str:  # fmt: skip
    return (
        f"tokentrace series {series}: {_where(ref, track)} of run {m.label} ({m.run_id}) is "
        f"{_fmt(ref, value)}: " + "; ".join(why)
    )


def _change_text(series: str, ref: sa.MetricRef, track: str, c: sa.Change, label: str) -> str:
    rel = f", {c.relative * 100:+.1f}%" if c.relative is not None else ""
    text = (
        f"tokentrace series {series}: change point in {_where(ref, track)} at run {label} "
        f"({c.run_after}): {c.kind}, {_fmt(ref, c.before)} -> {_fmt(ref, c.after)}{rel}"
    )
    if c.fields:
        changed = "; ".join(
            f"{f['label']}: {f['values'][0]} -> {f['values'][-1]}" for f in c.fields
        )
        text += f"; changed: {changed}"
    return text


def evaluate(sessions: sessionmaker[Session], series_id: str, base_url: str | None = None) -> int:
    """Judge the series' newly settled members against its rules; the alerts raised
    (each once: ``dedupe``). Marks them judged."""
    with session_scope(sessions) as s:
        row = series_repo.get_series(s, series_id)
        if row is None:
            return 0
        name, baseline_run = row.name, row.baseline_run_id
        rule_rows = [
            (r.id, sa.MetricRef(r.metric, r.stat), r.max_value, r.max_relative,
             r.change_points, r.created_at)
            for r in series_repo.alerts(s, series_id)
        ]  # fmt: skip
        states = series_repo.members(s, series_id, cell=sa.DEFAULT_REF_CELL)
    fresh = {m.id for m in states if not m.evaluated and m.state != "pending"}
    settled = {m.run_id: m.settled_at or m.added_at for m in states}
    raised: list[dict[str, Any]] = []
    for rule_id, ref, max_value, max_rel, cps, created in rule_rows:
        with session_scope(sessions) as s:
            rows = series_repo.members(s, series_id, cell=(ref.key, ref.stat))
        members = series_svc.trend_members(rows)
        for track in sa.tracks(members):
            t = sa.trend(members, ref, track=track)
            base = sa.baseline_value(t, baseline_run)
            for i, m in enumerate(t.runs):
                value = t.values[i]
                if not t.counted[i] or value is None or settled[m.run_id] <= created:
                    continue
                why = sa.threshold_breaches(
                    value,
                    better=ref.better,
                    absolute=max_value,
                    relative=max_rel,
                    baseline=base if m.run_id != baseline_run else None,
                )
                if why:
                    text = _threshold_text(name, ref, track, m, value, why)
                    facts = {"value": value, "reasons": why, "baseline": base}
                    raised.append(
                        _event(rule_id, series_id, name, ref, track, "threshold", m.run_id,
                               text, facts, base_url)
                    )  # fmt: skip
            if not cps:
                continue
            fresh_changes = [c for c in t.changes if settled[c.run_after] > created]
            if not fresh_changes:
                continue
            t = series_svc.with_keys(sessions, dataclasses.replace(t, changes=fresh_changes))
            for c in t.changes:
                label = t.runs[c.index].label
                raised.append(_event(rule_id, series_id, name, ref, track, "change_point",
                                     c.run_after, _change_text(name, ref, track, c, label),
                                     c.to_dict(), base_url))  # fmt: skip
    n = 0
    with session_scope(sessions) as s:
        for ev in raised:
            n += series_repo.add_event(s, **ev)
        series_repo.mark_evaluated(s, series_id, sorted(fresh))
    return n


def _event(alert_id: int, series_id: str, series: str, ref: sa.MetricRef, track: str, kind: str,
           run_id: str, text: str, details: dict[str, Any],
           base_url: str | None) -> dict[str, Any]:  # fmt: skip
    links = {}
    if base_url:
        links = {
            "series_url": f"{base_url}/series/{series}?metric={ref.text}",
            "run_url": f"{base_url}/runs/{run_id}",
        }
        text += f" <{links['run_url']}>"
    payload = {
        "series": series,
        "kind": kind,
        "metric": ref.key,
        "stat": ref.stat,
        "track": track,
        "run_id": run_id,
        **links,
        "details": details,
    }
    return {
        "alert_id": alert_id,
        "series_id": series_id,
        "run_id": run_id,
        "kind": kind,
        "dedupe": f"{kind}:{track}:{run_id}"[:128],
        "text": text,
        "payload": payload,
        "state": "pending",
        "attempts": 0,
    }


def evaluate_all(sessions: sessionmaker[Session], base_url: str | None = None) -> int:
    with session_scope(sessions) as s:
        ids = series_repo.unevaluated_series(s)
    return sum(evaluate(sessions, sid, base_url) for sid in ids)


# ---------------------------------------------------------------------------- delivery


@dataclass(frozen=True, slots=True)
class Delivery:
    event_id: int
    state: str
    attempts: int
    error: str | None


def _claim(s: Session, event_id: int, now: dt.datetime) -> bool:
    t = SeriesAlertEvent
    res = s.execute(
        update(t)
        .where(
            t.id == event_id,
            t.state == "pending",
            (t.next_attempt_at.is_(None)) | (t.next_attempt_at <= now),
        )
        .values(next_attempt_at=now + dt.timedelta(seconds=CLAIM_S))
    )
    return bool(getattr(res, "rowcount", 0))


def _send(client: httpx.Client, url: str, body: dict[str, Any], settings: Settings) -> str | None:
    """POST the alert; None when delivered, else why not."""
    why = resolved_refusal(url, settings)
    if why is not None:
        return f"refused: {why}"
    try:
        resp = client.post(
            url,
            content=json.dumps(body, allow_nan=False, default=str).encode(),
            headers={"Content-Type": "application/json", "User-Agent": USER_AGENT},
        )
    except httpx.HTTPError as e:
        return f"{type(e).__name__}: {str(e)[:200]}"
    if 200 <= resp.status_code < 300:
        return None
    return f"HTTP {resp.status_code}"


def deliver_due(
    sessions: sessionmaker[Session],
    settings: Settings,
    box: SecretBox,
    *,
    now: dt.datetime | None = None,
    limit: int = 20,
) -> list[Delivery]:
    """Send the alerts that are due (new, or their retry time has come)."""
    now = now or utcnow()
    with session_scope(sessions) as s:
        due = [e.id for e in series_repo.due_events(s, now, limit=limit)]
    out: list[Delivery] = []
    if not due:
        return out
    with httpx.Client(
        timeout=settings.alert_timeout_s, follow_redirects=False, trust_env=False
    ) as client:
        for event_id in due:
            out.append(_deliver_one(sessions, settings, box, client, event_id, now))
    return out


def _deliver_one(
    sessions: sessionmaker[Session],
    settings: Settings,
    box: SecretBox,
    client: httpx.Client,
    event_id: int,
    now: dt.datetime,
) -> Delivery:
    with session_scope(sessions) as s:
        if not _claim(s, event_id, now):
            return Delivery(event_id, "claimed elsewhere", 0, None)
        e = s.get(SeriesAlertEvent, event_id)
        rule = series_repo.get_alert(s, e.alert_id) if e is not None else None
        if e is None or rule is None:
            return Delivery(event_id, "gone", 0, None)
        body = {"text": e.text, **dict(e.payload or {})}
        attempts = e.attempts + 1
        sealed = rule.webhook_sealed
    try:
        url = box.open(sealed)
    except ValueError as err:
        error: str | None = f"the webhook URL cannot be opened: {err}"
    else:
        error = _send(client, url, body, settings)
    values: dict[str, Any] = {"attempts": attempts}
    if error is None:
        values |= {"state": "delivered", "delivered_at": utcnow(), "next_attempt_at": None,
                   "last_error": None}  # fmt: skip
        state = "delivered"
    elif attempts >= settings.alert_max_attempts:
        values |= {"state": "failed", "last_error": error[:ERROR_CHARS], "next_attempt_at": None}
        state = "failed"
    else:
        wait = min(settings.alert_retry_s * 2 ** (attempts - 1), MAX_BACKOFF_S)
        values |= {"last_error": error[:ERROR_CHARS],
                   "next_attempt_at": utcnow() + dt.timedelta(seconds=wait)}  # fmt: skip
        state = "pending"
    with session_scope(sessions) as s:
        series_repo.update_event(s, event_id, **values)
    if error is not None:
        log.warning("alert %s: delivery %d failed: %s", event_id, attempts, error)
    return Delivery(event_id, state, attempts, error)


def process(sessions: sessionmaker[Session], settings: Settings, box: SecretBox) -> int:
    """One pass: settle finished pending members, judge new ones, deliver what is due;
    how many deliveries were tried."""
    series_svc.settle_pending(sessions)
    evaluate_all(sessions, settings.public_url.rstrip("/") if settings.public_url else None)
    return len(deliver_due(sessions, settings, box))
