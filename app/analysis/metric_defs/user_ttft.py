"""User-perceived TTFT: connection setup (TCP connect + TLS handshake, 0 on a reused
connection) + TTFT (SPEC §1b). Needs the requests' connection phases; derived from the
stored columns, so not stored itself."""

from __future__ import annotations

from collections.abc import Mapping

from app.analysis.phases import NO_PHASES, user_ttft_ns

from .base import F64, Metric, RunBasis
from .ttft import TTFT


def _user_ttft(b: RunBasis) -> F64 | None:
    if b.trace.phases is None:
        return None
    ttft = b.value(TTFT.key)
    assert ttft is not None  # TTFT needs no more than the events
    return user_ttft_ns(ttft, b.trace.phases)


def _of_row(r: Mapping[str, object]) -> float | None:
    """One stored request's value (ns) from its ``ttft_ns``, ``connect_ns`` and ``tls_ns``;
    None without a TTFT or without recorded phases (no connection)."""
    ttft, connect, tls = r.get("ttft_ns"), r.get("connect_ns"), r.get("tls_ns")
    if not isinstance(ttft, int | float) or r.get("conn_id") is None:
        return None
    setup = sum(v for v in (connect, tls) if isinstance(v, int | float))
    return float(ttft + setup)


USER_TTFT = Metric(
    key="user_ttft_ms",
    label="TTFT+setup",
    title="TTFT with connection setup",
    unit="ms",
    decimals=2,
    aggregation="per_request",
    short="User-perceived TTFT",
    per_request=_user_ttft,
    requires="connection phases",
    no_data=NO_PHASES,
    seed=6,
    from_row=_of_row,
    slo="user_ttft",
)
