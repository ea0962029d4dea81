"""The server's own prefill and decode time over a run, from its scraped counters. Pure.

Servers report what they spent, not what the client waited:

* **llama.cpp**: ``llamacpp:prompt_seconds_total`` (time processing prompts) and
  ``llamacpp:tokens_predicted_seconds_total`` (time generating), beside
  ``llamacpp:tokens_predicted_total``. Per request (tools/server), the prompt time runs from
  the moment its slot starts on the prompt to its first token sampled (``t_prompt_processing``);
  the generation time from that first token to the slot's release (``t_token_generation``),
  while the tokens predicted count the first token too (``n_decoded``). It counts no requests:
  prefill per request divides by the run's successful requests (warm-ups included: the server
  served them too), and decode per token divides by the tokens predicted less one per request,
  as the generation time covers n - 1 steps of a request's n tokens.
* **vLLM**: the ``_sum`` / ``_count`` of ``vllm:request_prefill_time_seconds`` and
  ``vllm:request_decode_time_seconds``: prefill per request is sum / count; decode per token
  divides by ``vllm:generation_tokens_total`` less one token per request (the first token
  comes out of the prefill).

Each counter's increase runs from the first scrape (taken before the load starts) to the last
(taken after the last request ended).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.analysis.metric_defs import ITL, TPOT, TTFT, Metric
from app.protocol.prometheus import Series, counter_increase


def _increase(series: Sequence[Series], role: str) -> float | None:
    """Summed increase of the role's series (None: no series, or one sample only)."""
    found = [s for s in series if s.role == role and len(s.values) >= 2]
    if not found:
        return None
    return sum(counter_increase(s.values) for s in found)


def server_timing(series: Sequence[Series], *, requests: int) -> dict[str, Any] | None:
    """Prefill seconds per request and decode seconds per generated token, as the server
    counted them; None when the target exposes neither time (or was scraped only once)."""
    prefill = _increase(series, "prefill_seconds")
    decode = _increase(series, "decode_seconds")
    if prefill is None and decode is None:
        return None
    names = {s.name for s in series if s.role in ("prefill_seconds", "decode_seconds")}
    source = "vllm" if any(n.startswith("vllm:") for n in names) else "llamacpp"
    generated = _increase(series, "generation_tokens")
    prefill_n = _increase(series, "prefill_requests")
    decode_n = _increase(series, "decode_requests")
    per_request: float | None = None
    per_token: float | None = None
    if source == "vllm":
        if prefill is not None and prefill_n:
            per_request = prefill / prefill_n
        tokens = None if generated is None or decode_n is None else generated - decode_n
        if decode is not None and tokens and tokens > 0:
            per_token = decode / tokens
        basis = "vLLM histograms: prefill sum / count; decode sum / (generation tokens - requests)"
    else:
        if prefill is not None and requests > 0:
            per_request = prefill / requests
        steps = None if generated is None else generated - requests
        if decode is not None and steps and steps > 0:
            per_token = decode / steps
        basis = (
            f"llama.cpp counters: prompt seconds / {requests} successful requests of the run "
            "(warm-ups included); generation seconds / (tokens predicted - requests): the "
            "generation clock starts at each request's first token"
        )
    return {
        "source": source,
        "prefill_s_total": prefill,
        "decode_s_total": decode,
        "generated_tokens": generated,
        "requests": requests,
        "prefill_s_per_request": per_request,
        "decode_s_per_token": per_token,
        "basis": basis,
    }


def client_mean_key(m: Metric) -> str:
    """The key of the client's mean of ``m`` beside the server's timing: "client_<key>_mean"."""
    return f"client_{m.key}_mean"


def beside_client(timing: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    """The server's own times (ms) beside the client's TTFT, ITL and TPOT means (ms): the
    server's prefill is part of TTFT (the rest is the wait for a free slot or a scheduler
    step, the HTTP handling and the network); its decode time per token compares with
    ITL/TPOT."""

    def mean(key: str) -> float | None:
        d = metrics.get(key)
        v = d.get("mean") if isinstance(d, dict) else None
        return float(v) if isinstance(v, int | float) else None

    def ms(key: str) -> float | None:
        v = timing.get(key)
        return float(v) * 1000.0 if isinstance(v, int | float) else None

    return {
        "source": timing.get("source"),
        "basis": timing.get("basis"),
        "server_prefill_ms_per_request": ms("prefill_s_per_request"),
        client_mean_key(TTFT): mean(TTFT.key),
        "server_decode_ms_per_token": ms("decode_s_per_token"),
        client_mean_key(ITL): mean(ITL.key),
        client_mean_key(TPOT): mean(TPOT.key),
    }
