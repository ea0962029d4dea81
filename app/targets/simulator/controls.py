"""The simulator's server controls, as vLLM and SGLang serve them: the prefix-cache reset
(``POST /reset_prefix_cache``, vLLM; ``POST /flush_cache``, SGLang; which one by
``SimConfig.prefix_cache_reset``) that really empties ``prefix_cache.PrefixCache``; the
profiler (``POST /start_profile``, ``POST /stop_profile``: both answer the trace's path, no
file is written); the engine's identity (``GET /version``, ``GET /server_info``). A control
the config turns off is a 404, as on an engine without it. What was asked, when, and after
how many completion requests is kept for the ground truth (``ControlLog``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import monotonic_ns
from typing import Any

from app import __version__
from app.targets.sim_config import SimConfig
from app.targets.simulator.prefix_cache import PrefixCache

RESET_PATHS = {"vllm": "/reset_prefix_cache", "sglang": "/flush_cache"}


@dataclass(slots=True)
class ControlLog:
    """What the controls did: each call as ``{"control", "t_ns", "after_requests"}``."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    profiling: bool = False
    traces: int = 0

    def note(self, control: str, requests_seen: int) -> None:
        self.calls.append(
            {"control": control, "t_ns": monotonic_ns(), "after_requests": requests_seen}
        )


def routes(config: SimConfig) -> dict[str, str]:
    """Path -> control name of the controls this config serves (all POST but identity)."""
    out: dict[str, str] = {}
    reset = RESET_PATHS.get(config.prefix_cache_reset)
    if reset is not None:
        out[reset] = "reset_prefix_cache"
    if config.profiler:
        out["/start_profile"] = "start_profile"
        out["/stop_profile"] = "stop_profile"
    if config.identity:
        out["/version"] = "version"
        out["/server_info"] = "server_info"
    return out


def method_of(control: str) -> str:
    return "GET" if control in ("version", "server_info") else "POST"


def answer(
    control: str,
    config: SimConfig,
    log: ControlLog,
    cache: PrefixCache | None,
    requests_seen: int,
) -> dict[str, Any]:
    """The JSON answer of ``control`` (and its effect)."""
    if control == "version":
        return {"version": f"tokentrace-sim {__version__}"}
    if control == "server_info":
        return {
            "engine": "tokentrace-sim",
            "model": config.model,
            "max_model_len": config.max_model_len,
            "seed": config.seed,
            "prefix_cache_block": config.prefix_cache_block,
            "speculative_config": {
                "num_speculative_tokens": config.spec_decode_draft_len,
                "acceptance": config.spec_decode_acceptance,
            },
        }
    log.note(control, requests_seen)
    if control == "reset_prefix_cache":
        if cache is not None:
            cache.reset()
        return {"ok": True}
    if control == "start_profile":
        log.profiling = True
        log.traces += 1
        return {"status": "profiling", "trace_path": trace_path(config, log.traces)}
    # stop_profile
    log.profiling = False
    return {"status": "stopped", "trace_path": trace_path(config, log.traces)}


def trace_path(config: SimConfig, n: int) -> str:
    return f"{config.profile_dir.rstrip('/')}/sim-trace-{n}.json"
