"""Configuration of ``tokentrace sim`` (the deterministic streaming simulator).

Timing model (all times from the moment the request was fully received, ``received_ns``):

- token ``j`` (0-based) is "generated" at ``received + TTFT + ITL_1 + ... + ITL_j`` where
  ``TTFT = ttft_ms + per_input_token_ms * (input_tokens - cached_tokens)`` (input tokens
  counted with the built-in tokenizer; cached ones by the optional prefix cache,
  ``prefix_cache_block``) and each ``ITL = itl_ms + itl_per_active_ms * active_streams +
  uniform(-itl_jitter_ms, +itl_jitter_ms)`` (jitter seeded per request, clamped at 0);
- an SSE event packs up to ``tokens_per_event`` tokens and is written when its last token is
  generated (reasoning and content tokens never share an event);
- when the server falls behind (overload), a stream's events that are already overdue are
  written together in one write (``coalesce_late``): fewer syscalls, same per-event stamps;
- the optional role-only chunk (chat only) and the response headers are written as soon as
  the request has been received, like real servers do;
- a surface that generates no tokens (embeddings, rerank) answers once, whole, at
  ``received + ttft_ms + per_input_token_ms * input_tokens`` (embeddings of
  ``embedding_dim`` floats, seeded by each input's text; scores likewise);
- a chat request carrying ``tools`` is answered, with probability ``tool_call_rate``
  (seeded per request), by one tool call: its function (the named ``tool_choice``, else
  one of ``tools`` drawn by the seed) in the first delta, the output tokens as argument
  deltas, ``finish_reason`` ``tool_calls``; an image part of a message (``image_url``)
  counts ``image_tokens`` prompt tokens.

Faults are decided per request from ``seed`` and the request counter (1, 2, ... in order of
arrival, reset by ``POST /_sim/reset``). One uniform draw picks at most one fault, so the
rates must sum to at most 1.
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, fields
from typing import Any


class Fault(enum.StrEnum):
    NONE = "none"
    ERROR = "error"  # HTTP 500 with a JSON error body
    DISCONNECT = "disconnect"  # abortive close (RST) after k tokens
    STALL = "stall"  # stop sending after k tokens, keep the connection open
    MALFORMED = "malformed"  # a non-JSON data line before the event after k tokens
    HANG = "hang"  # read the request, never answer


# Order in which the cumulative fault thresholds are laid out on [0, 1).
FAULT_ORDER: tuple[Fault, ...] = (
    Fault.ERROR,
    Fault.DISCONNECT,
    Fault.STALL,
    Fault.MALFORMED,
    Fault.HANG,
)


@dataclass(frozen=True, slots=True)
class SimConfig:
    host: str = "127.0.0.1"
    port: int = 0  # 0: ephemeral
    model: str = "tokentrace-sim"
    # timing
    ttft_ms: float = 50.0
    per_input_token_ms: float = 0.0
    itl_ms: float = 10.0
    itl_jitter_ms: float = 0.0
    itl_per_active_ms: float = 0.0
    tokens_per_event: int = 1
    # stream shape
    role_chunk: bool = True
    output_len: int = 128  # when the request has no max_tokens
    eos_len: int | None = None  # "natural" length when ignore_eos is false (None: never stop)
    reasoning_tokens: int = 0  # first K output tokens sent as delta.reasoning_content (chat)
    chat_template_tokens: int = 0  # prompt tokens a chat template adds (usage counts them)
    created: int | None = None  # fixed "created" field (None: wall clock at receipt)
    embedding_dim: int = 8  # an embedding's length (the embeddings surface), unless asked
    # a chat request carrying ``tools`` is answered by a streamed tool call with this
    # probability (seeded per request); the rest answer text
    tool_call_rate: float = 1.0
    image_tokens: int = 256  # prompt tokens each image part of a chat message counts
    seed: int = 0
    # faults (per request, mutually exclusive; sum <= 1)
    error_rate: float = 0.0
    disconnect_rate: float = 0.0
    stall_rate: float = 0.0
    malformed_rate: float = 0.0
    hang_rate: float = 0.0
    fault_after_tokens: int | None = None  # None: k drawn per request in [0, output)
    # server
    kv_capacity_tokens: int = 262_144  # denominator of vllm:gpu_cache_usage_perc
    # prefix cache (``app.targets.simulator.prefix_cache``): block size in tokens, 0 = none
    prefix_cache_block: int = 0
    prefix_cache_blocks: int = 65_536  # blocks remembered (least recently used forgotten)
    # server controls (``app.targets.simulator.controls``): which prefix-cache reset it
    # serves ("vllm": POST /reset_prefix_cache, "sglang": POST /flush_cache, "none"),
    # POST /start_profile and /stop_profile (False: 404), GET /version and /server_info
    # (False: 404); max_model_len is listed in /v1/models
    prefix_cache_reset: str = "vllm"
    profiler: bool = True
    profile_dir: str = "/tmp/tokentrace-sim-traces"
    identity: bool = True
    max_model_len: int = 32_768
    # speculative decoding (``app.targets.simulator.spec_decode``): draft tokens per step
    # (0: off) and each draft token's acceptance probability (seeded draws)
    spec_decode_draft_len: int = 0
    spec_decode_acceptance: float = 0.7
    max_body_bytes: int = 64 * 1024 * 1024
    coalesce_late: bool = True  # when behind schedule, send a stream's overdue events together
    spin_us: int = 1000  # busy-poll window before a deadline (epoll sleeps in whole ms)
    record_ground_truth: bool = True
    # connections: HTTP/1.1 keep-alive as real servers do; close a connection left idle this
    # long (0: never); answer at most this many requests on one (0: no cap; the last one
    # says "connection: close")
    keep_alive: bool = True
    idle_timeout_s: float = 5.0
    max_requests_per_conn: int = 0
    kernel_rx_stamps: bool = True  # stamp each request's first byte with the kernel's time
    # TLS: serve https with this certificate (chain, PEM) and private key (PEM); both or none
    tls_certfile: str | None = None
    tls_keyfile: str | None = None

    def __post_init__(self) -> None:
        _check(0 <= self.port <= 65535, "port must be in 0..65535")
        _check(bool(self.host), "host must not be empty")
        _check(bool(self.model), "model must not be empty")
        for name in (
            "ttft_ms",
            "per_input_token_ms",
            "itl_ms",
            "itl_jitter_ms",
            "itl_per_active_ms",
        ):
            v = getattr(self, name)
            _check(math.isfinite(v) and v >= 0, f"{name} must be a finite number >= 0")
        _check(self.tokens_per_event >= 1, "tokens_per_event must be >= 1")
        _check(
            math.isfinite(self.idle_timeout_s) and self.idle_timeout_s >= 0,
            "idle_timeout_s must be a finite number >= 0",
        )
        _check(self.max_requests_per_conn >= 0, "max_requests_per_conn must be >= 0")
        _check(self.output_len >= 1, "output_len must be >= 1")
        _check(self.eos_len is None or self.eos_len >= 1, "eos_len must be >= 1")
        _check(self.reasoning_tokens >= 0, "reasoning_tokens must be >= 0")
        _check(self.chat_template_tokens >= 0, "chat_template_tokens must be >= 0")
        _check(1 <= self.embedding_dim <= 65_536, "embedding_dim must be in 1..65536")
        _check(
            math.isfinite(self.tool_call_rate) and 0.0 <= self.tool_call_rate <= 1.0,
            "tool_call_rate must be in [0, 1]",
        )
        _check(0 <= self.image_tokens <= 1_000_000, "image_tokens must be in 0..1000000")
        _check(
            self.fault_after_tokens is None or self.fault_after_tokens >= 0,
            "fault_after_tokens must be >= 0",
        )
        total = 0.0
        for f in FAULT_ORDER:
            rate = self.fault_rate(f)
            _check(math.isfinite(rate) and 0.0 <= rate <= 1.0, f"{f}_rate must be in [0, 1]")
            total += rate
        _check(total <= 1.0 + 1e-9, "fault rates must sum to at most 1")
        _check(self.kv_capacity_tokens >= 1, "kv_capacity_tokens must be >= 1")
        _check(0 <= self.prefix_cache_block <= 4096, "prefix_cache_block must be in 0..4096")
        _check(self.prefix_cache_blocks >= 1, "prefix_cache_blocks must be >= 1")
        _check(
            self.prefix_cache_reset in ("vllm", "sglang", "none"),
            "prefix_cache_reset must be vllm, sglang or none",
        )
        _check(1 <= self.max_model_len <= 100_000_000, "max_model_len must be in 1..1e8")
        _check(0 <= self.spec_decode_draft_len <= 64, "spec_decode_draft_len must be in 0..64")
        _check(
            math.isfinite(self.spec_decode_acceptance) and 0 <= self.spec_decode_acceptance <= 1,
            "spec_decode_acceptance must be in [0, 1]",
        )
        _check(self.max_body_bytes >= 1024, "max_body_bytes must be >= 1024")
        _check(self.spin_us >= 0, "spin_us must be >= 0")
        _check(
            (self.tls_certfile is None) == (self.tls_keyfile is None),
            "tls_certfile and tls_keyfile go together: give both (https) or neither (http)",
        )
        _check(
            self.tls_certfile != "" and self.tls_keyfile != "", "TLS file names must not be empty"
        )

    @property
    def tls(self) -> bool:
        return self.tls_certfile is not None

    def fault_rate(self, fault: Fault) -> float:
        rate: float = getattr(self, f"{fault.value}_rate")
        return rate

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SimConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown simulator settings: {', '.join(unknown)}")
        return cls(**data)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
