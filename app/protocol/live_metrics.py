"""The few server series a running run's page follows live (pure): from one scrape of the
target's ``/metrics``, each role's value summed over its label sets (requests running and
waiting, KV-cache usage, prompt and generation token counters), under the first of the
role's known names the server exposes (``prometheus.KNOWN_SERIES``). A worker sends the
latest with each heartbeat (``wire.JobProgress.server_metrics``)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from app.protocol.prometheus import KNOWN_SERIES, Sample

LIVE_ROLES: tuple[str, ...] = (
    "running",
    "waiting",
    "kv_cache_usage",
    "prompt_tokens",
    "generation_tokens",
)
COUNTER_ROLES = frozenset({"prompt_tokens", "generation_tokens"})  # shown as rates


def snapshot(samples: Iterable[Sample]) -> dict[str, float]:
    """Role -> value of one scrape (roles the server does not expose are absent)."""
    by_name: dict[str, float] = {}
    for s in samples:
        if math.isfinite(s.value):
            by_name[s.name] = by_name.get(s.name, 0.0) + s.value
    out: dict[str, float] = {}
    for role in LIVE_ROLES:
        name = next((n for n in KNOWN_SERIES[role] if n in by_name), None)
        if name is not None:
            out[role] = by_name[name]
    return out
