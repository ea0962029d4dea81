"""The simulator's ``GET /metrics``: Prometheus text with vLLM-like names (requests running
and waiting, simulated KV-cache usage, prompt and generation token counters, requests
answered in full) and its own series (completion requests by injected fault, open
connections), read from the server's counters at the moment of the scrape.
"""

from __future__ import annotations

import json
from typing import Protocol

from app.targets.sim_config import SimConfig
from app.targets.simulator.prefix_cache import PrefixCache
from app.targets.simulator.spec_decode import SpecCounts


class Counters(Protocol):
    """The server's state a scrape reads (``SimServer``)."""

    config: SimConfig
    running: int
    waiting: int
    kv_tokens: int
    prompt_tokens_total: int
    generation_tokens_total: int
    success_total: int
    requests_by_fault: dict[str, int]
    prefix_cache: PrefixCache | None
    spec: SpecCounts


def metrics_text(srv: Counters, open_connections: int) -> str:
    """The Prometheus text of ``srv``'s counters now."""
    label = "{model_name=" + json.dumps(srv.config.model) + "}"
    cache = min(1.0, max(0.0, srv.kv_tokens / srv.config.kv_capacity_tokens))
    rows: list[tuple[str, str, str, str, float]] = [
        (
            "vllm:num_requests_running",
            "gauge",
            "Requests generating tokens.",
            label,
            srv.running,
        ),
        (
            "vllm:num_requests_waiting",
            "gauge",
            "Requests before their first token.",
            label,
            srv.waiting,
        ),
        (
            "vllm:gpu_cache_usage_perc",
            "gauge",
            "Simulated KV-cache usage (1 = full).",
            label,
            cache,
        ),
        (
            "vllm:prompt_tokens_total",
            "counter",
            "Prompt tokens of accepted requests.",
            label,
            srv.prompt_tokens_total,
        ),
        (
            "vllm:generation_tokens_total",
            "counter",
            "Generated tokens sent.",
            label,
            srv.generation_tokens_total,
        ),
        (
            "vllm:request_success_total",
            "counter",
            "Requests answered in full.",
            label,
            srv.success_total,
        ),
    ]
    pc = srv.prefix_cache
    if pc is not None:
        rows += [
            (
                "vllm:prefix_cache_queries_total",
                "counter",
                "Prompt tokens looked up in the prefix cache.",
                label,
                pc.queries,
            ),
            (
                "vllm:prefix_cache_hits_total",
                "counter",
                "Of them, tokens found cached.",
                label,
                pc.hits,
            ),
        ]
    sd = srv.spec
    if srv.config.spec_decode_draft_len:
        rows += [
            ("vllm:spec_decode_num_drafts_total", "counter", "Draft steps.", label, sd.drafts),
            (
                "vllm:spec_decode_num_draft_tokens_total",
                "counter",
                "Tokens drafted.",
                label,
                sd.draft_tokens,
            ),
            (
                "vllm:spec_decode_num_accepted_tokens_total",
                "counter",
                "Draft tokens accepted.",
                label,
                sd.accepted,
            ),
        ]
    lines: list[str] = []
    for name, kind, help_text, labels, value in rows:
        lines += [
            f"# HELP {name} {help_text}",
            f"# TYPE {name} {kind}",
            f"{name}{labels} {_num(value)}",
        ]
    if srv.config.spec_decode_draft_len:
        name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
        lines += [f"# HELP {name} Draft tokens accepted, by position.", f"# TYPE {name} counter"]
        model = json.dumps(srv.config.model)
        lines += [
            f'{name}{{model_name={model},position="{i}"}} {n}'
            for i, n in enumerate(sd.accepted_per_pos)
        ]
    lines += [
        "# HELP tokentrace_sim_requests_total Completion requests by injected fault.",
        "# TYPE tokentrace_sim_requests_total counter",
    ]
    lines += [
        f'tokentrace_sim_requests_total{{fault="{f}"}} {n}'
        for f, n in srv.requests_by_fault.items()
    ]
    lines += [
        "# HELP tokentrace_sim_open_connections Open connections.",
        "# TYPE tokentrace_sim_open_connections gauge",
        f"tokentrace_sim_open_connections {open_connections}",
    ]
    return "\n".join(lines) + "\n"


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))
