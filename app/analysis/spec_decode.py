"""Speculative-decoding acceptance over a run's measured window, from the engine's counters.
Pure.

vLLM counts, per engine: draft steps (``vllm:spec_decode_num_drafts_total``), tokens drafted
(``..._num_draft_tokens_total``), tokens of them accepted (``..._num_accepted_tokens_total``)
and accepted tokens by draft position (``..._num_accepted_tokens_per_pos_total{position}``).
Two readings are taken, right before the first measured request and right after the last
(``app.client.server_controls``); over their difference (a counter that fell was reset:
counted from 0):

* acceptance rate = accepted / drafted tokens;
* mean acceptance length = 1 + accepted / drafts (vLLM's: the tokens one target-model step
  yields, its own bonus token included); without the drafts counter it is not given;
* per position i: accepted at i / drafts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
NAMES = frozenset({ACCEPTED, DRAFT_TOKENS, DRAFTS, PER_POS})
MAX_POSITIONS = 64


def reading_key(name: str, labels: Mapping[str, str]) -> str | None:
    """The key a sample is summed under in a reading: its name, or ``pos:<i>`` for a
    per-position sample (None: not one of ours, or a position past ``MAX_POSITIONS``)."""
    if name == PER_POS:
        pos = labels.get("position", "")
        if not pos.isdigit() or int(pos) >= MAX_POSITIONS:
            return None
        return f"pos:{int(pos)}"
    return name if name in NAMES else None


def _rise(start: Mapping[str, float], end: Mapping[str, float], key: str) -> float | None:
    if key not in end:
        return None
    a, b = start.get(key, 0.0), end[key]
    return b - a if b >= a else b


def rises(pairs: list[tuple[Mapping[str, float], Mapping[str, float]]]) -> dict[str, float]:
    """Several engines' (start, end) readings as one end reading from zero: each counter's
    rise (``_rise``: a counter that fell was reset) summed over the engines, so that
    ``spec_decode({}, rises(pairs))`` is the acceptance over all of them."""
    out: dict[str, float] = {}
    for start, end in pairs:
        for key in end:
            rise = _rise(start, end, key)
            if rise is not None:
                out[key] = out.get(key, 0.0) + rise
    return out


def spec_decode(start: Mapping[str, float], end: Mapping[str, float]) -> dict[str, Any] | None:
    """The acceptance figures between two readings (``reading_key`` -> summed value); None
    when the end reading has no accepted or drafted-token counter, or nothing was drafted."""
    accepted = _rise(start, end, ACCEPTED)
    drafted = _rise(start, end, DRAFT_TOKENS)
    if accepted is None or drafted is None:
        return None
    drafts = _rise(start, end, DRAFTS)
    positions = sorted(int(k[4:]) for k in end if k.startswith("pos:"))
    per_pos: list[float | None] = []
    if drafts:
        per_pos = [(_rise(start, end, f"pos:{i}") or 0.0) / drafts for i in positions]
    return {
        "source": "vllm",
        "window": "measured",
        "drafts": drafts,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / drafted if drafted > 0 else None,
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts else None,
        "draft_length": drafted / drafts if drafts else None,
        "per_position_acceptance": per_pos,
        "basis": "vLLM counters, from right before the first measured request to right after "
        "the last: accepted / drafted tokens; mean acceptance length 1 + accepted / drafts",
    }
