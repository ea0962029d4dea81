"""The Roofline (SPEC section 5): analytic FLOPs and fewest bytes of linear layers, decoder
layers and whole models in prefill and decode, lower-bound times, and serving operating
points (MFU, MBU) from a run's measured throughput. Pure functions, no I/O.

Conventions:
- A linear X[M,K] x W[K,N]: F = 2MKN, Q = b_act(MK + MN) + b_w KN (= b(MK+KN+MN) when the
  dtypes match, the SPEC's formula).
- Attention is counted flash-style: Q read, every cached K and V position read once per
  sequence per layer (``kv_heads`` of them: GQA-aware), O written; the new K and V are the
  k/v projections' outputs (already counted there). Scores and weighted sum: 4 x heads x
  head_dim FLOPs per (query, key) pair; a causal prefill of S tokens has S(S+1)/2 pairs.
- Logits are computed for one position per sequence (what serving engines do).
- Dense decoder layers only (q, k, v, o, gated MLP); MLA and mixture-of-experts models are
  refused with a reason, not approximated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from app.analysis.model_presets import ModelConfig

Phase = Literal["prefill", "decode"]
Limit = Literal["memory", "compute"]


@dataclass(frozen=True, slots=True)
class Cost:
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """FLOP per byte (inf when no bytes move)."""
        return self.flops / self.bytes if self.bytes else float("inf")

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.bytes + other.bytes)

    def scaled(self, k: float) -> Cost:
        return Cost(self.flops * k, self.bytes * k)


ZERO = Cost(0.0, 0.0)


@dataclass(frozen=True, slots=True)
class Bound:
    """``time_s = max(compute_s, memory_s)`` and which one limits."""

    time_s: float
    compute_s: float
    memory_s: float
    limit: Limit


def linear_cost(m: int, k: int, n: int, b: float, *, weight_bytes: float | None = None) -> Cost:
    """X[m,k] x W[k,n]: FLOPs 2mkn, fewest bytes b(mk + mn) + b_w kn."""
    if min(m, k, n) < 0 or b <= 0:
        raise ValueError("m, k, n must be >= 0 and b > 0")
    bw = b if weight_bytes is None else weight_bytes
    return Cost(2.0 * m * k * n, b * (m * k + m * n) + bw * k * n)


def machine_balance(peak_flops: float, bandwidth_bps: float) -> float:
    """FLOP per byte at which a kernel is equally compute and memory bound."""
    if peak_flops <= 0 or bandwidth_bps <= 0:
        raise ValueError("peak and bandwidth must be positive")
    return peak_flops / bandwidth_bps


def lower_bound(cost: Cost, peak_flops: float, bandwidth_bps: float) -> Bound:
    """time >= max(F / peak, Q / bandwidth)."""
    if peak_flops <= 0 or bandwidth_bps <= 0:
        raise ValueError("peak and bandwidth must be positive")
    c = cost.flops / peak_flops
    mem = cost.bytes / bandwidth_bps
    return Bound(max(c, mem), c, mem, "compute" if c > mem else "memory")


def attainable(intensity: float, peak_flops: float, bandwidth_bps: float) -> float:
    """The roof at an arithmetic intensity: min(peak, intensity x bandwidth)."""
    return min(peak_flops, intensity * bandwidth_bps)


# --------------------------------------------------------------------- decoder layers


@dataclass(frozen=True, slots=True)
class Dtypes:
    """Bytes per element of weights, activations and the KV cache."""

    weight: float = 2.0
    act: float = 2.0
    kv: float = 2.0


@dataclass(frozen=True, slots=True)
class StepCost:
    """One forward step of the whole model: per-part costs of one layer, the model total."""

    phase: Phase
    batch: int
    new_tokens: int  # per sequence
    context: int  # cached tokens per sequence before the step
    layer_parts: dict[str, Cost]
    layer: Cost
    total: Cost
    notes: list[str] = field(default_factory=list)


def _check_dense(m: ModelConfig) -> None:
    if m.attention != "gqa":
        raise ValueError(
            f"model {m.name!r} uses MLA attention: per-layer costs model dense GQA/MHA "
            "layers only (the capacity planner handles MLA)"
        )
    if m.is_moe:
        raise ValueError(
            f"model {m.name!r} is a mixture of experts: per-layer costs model dense layers "
            "only (the capacity planner handles it)"
        )
    if m.intermediate <= 0:
        raise ValueError(f"model {m.name!r} has no intermediate (MLP) size")


def attention_cost(m: ModelConfig, batch: int, new_tokens: int, context: int, dt: Dtypes) -> Cost:
    """Scores and weighted sum over cached + new positions (causal), GQA-aware KV reads."""
    t, c = new_tokens, context
    pairs = t * c + t * (t + 1) / 2  # (query, key) pairs per sequence, per head
    flops = 4.0 * m.heads * m.head_dim * pairs * batch
    q_o = 2.0 * t * m.heads * m.head_dim * dt.act  # read Q, write O
    kv = 2.0 * (c + t) * m.kv_heads * m.head_dim * dt.kv  # read every K and V once
    return Cost(flops, (q_o + kv) * batch)


def layer_parts(
    m: ModelConfig, batch: int, new_tokens: int, context: int, dt: Dtypes
) -> dict[str, Cost]:
    """Cost of each part of one dense decoder layer for one step."""
    _check_dense(m)
    if batch < 1 or new_tokens < 1 or context < 0:
        raise ValueError("batch and new_tokens must be >= 1 and context >= 0")
    rows = batch * new_tokens
    h, q, kv = m.hidden, m.heads * m.head_dim, m.kv_heads * m.head_dim

    def lin(k: int, n: int) -> Cost:
        return linear_cost(rows, k, n, dt.act, weight_bytes=dt.weight)

    return {
        "q_proj": lin(h, q),
        "k_proj": lin(h, kv),
        "v_proj": lin(h, kv),
        "attention": attention_cost(m, batch, new_tokens, context, dt),
        "o_proj": lin(q, h),
        "gate_proj": lin(h, m.intermediate),
        "up_proj": lin(h, m.intermediate),
        "down_proj": lin(m.intermediate, h),
    }


def step_cost(
    m: ModelConfig,
    phase: Phase,
    *,
    batch: int,
    tokens: int,
    context: int = 0,
    dtypes: Dtypes | None = None,
) -> StepCost:
    """One model step. ``prefill``: ``batch`` prompts of ``tokens`` tokens from an empty
    cache. ``decode``: ``batch`` sequences each adding one token after ``context`` cached
    tokens (``tokens`` is ignored and taken as 1)."""
    dt = dtypes or Dtypes()
    if phase == "prefill":
        new, ctx = tokens, 0
    elif phase == "decode":
        new, ctx = 1, context
    else:
        raise ValueError(f"phase must be 'prefill' or 'decode', got {phase!r}")
    parts = layer_parts(m, batch, new, ctx, dt)
    layer = ZERO
    for c in parts.values():
        layer = layer + c
    total = layer.scaled(m.layers)
    notes: list[str] = []
    if m.vocab:
        total = total + linear_cost(batch, m.hidden, m.vocab, dt.act, weight_bytes=dt.weight)
        total = total + Cost(0.0, batch * new * m.hidden * dt.weight)  # embedding rows read
    else:
        notes.append("no vocab size: embeddings and logits left out")
    return StepCost(phase, batch, new, ctx, parts, layer, total, notes)


# ------------------------------------------------------------------ operating points


@dataclass(frozen=True, slots=True)
class OperatingPoint:
    """Achieved rates of one phase of a serving run, placed on the roofline."""

    phase: Phase
    batch: int
    context: int
    time_s: float  # the step (decode) or per-request prefill time it was measured over
    flops_s: float
    bytes_s: float
    intensity: float
    mfu: float | None
    mbu: float | None
    explanation: str


def decode_point(
    m: ModelConfig,
    *,
    concurrency: int,
    input_len: int,
    output_len: int,
    output_tok_s: float,
    dtypes: Dtypes | None = None,
    peak_flops: float | None = None,
    bandwidth_bps: float | None = None,
) -> OperatingPoint:
    """Decode at batch = concurrency: one step makes ``concurrency`` tokens, so a step
    takes ``concurrency / output_tok_s``; context is the mean during decode
    (input + output / 2)."""
    if concurrency < 1 or output_tok_s <= 0:
        raise ValueError("concurrency must be >= 1 and output_tok_s > 0")
    ctx = input_len + output_len // 2
    step = step_cost(m, "decode", batch=concurrency, tokens=1, context=ctx, dtypes=dtypes)
    t = concurrency / output_tok_s
    fl, by = step.total.flops / t, step.total.bytes / t
    mfu = fl / peak_flops if peak_flops else None
    mbu = by / bandwidth_bps if bandwidth_bps else None
    text = (
        f"decode at batch {concurrency}, context ~{ctx}: {output_tok_s:.1f} tok/s means one "
        f"step per {t * 1e3:.2f} ms; analytic step {step.total.flops / 1e9:.2f} GFLOP, "
        f"{step.total.bytes / 1e9:.3f} GB"
    )
    return OperatingPoint(
        "decode", concurrency, ctx, t, fl, by, step.total.intensity, mfu, mbu, text
    )


def prefill_point(
    m: ModelConfig,
    *,
    input_len: int,
    ttft_s: float,
    dtypes: Dtypes | None = None,
    peak_flops: float | None = None,
    bandwidth_bps: float | None = None,
) -> OperatingPoint:
    """Prefill of one prompt over its TTFT. TTFT includes queueing and the network, so
    the achieved rate is a lower bound on what prefill itself reached."""
    if input_len < 1 or ttft_s <= 0:
        raise ValueError("input_len must be >= 1 and ttft_s > 0")
    step = step_cost(m, "prefill", batch=1, tokens=input_len, dtypes=dtypes)
    fl, by = step.total.flops / ttft_s, step.total.bytes / ttft_s
    mfu = fl / peak_flops if peak_flops else None
    mbu = by / bandwidth_bps if bandwidth_bps else None
    text = (
        f"prefill of {input_len} tokens over TTFT {ttft_s * 1e3:.1f} ms: analytic "
        f"{step.total.flops / 1e9:.1f} GFLOP (TTFT includes queueing: a lower bound)"
    )
    return OperatingPoint("prefill", 1, 0, ttft_s, fl, by, step.total.intensity, mfu, mbu, text)


# --------------------------------------------------------------------- weight-read floor


def weight_read_floor_s(
    m: ModelConfig,
    bandwidth_bps: float,
    *,
    dtypes: Dtypes | None = None,
    peak_flops: float | None = None,
) -> float:
    """The fastest one decode step (one token, batch 1, empty cache) can be: every weight
    read once at ``bandwidth_bps`` (SPEC §5), i.e. the time-per-output-token floor.

    Dense GQA/MHA models: the whole-model decode step's lower bound (weights dominate its
    bytes). MLA and mixture-of-experts models: the parameters used per token x weight bytes
    / bandwidth."""
    if bandwidth_bps <= 0:
        raise ValueError("bandwidth must be positive")
    dt = dtypes or Dtypes()
    if m.attention == "gqa" and not m.is_moe and m.intermediate > 0:
        cost = step_cost(m, "decode", batch=1, tokens=1, context=0, dtypes=dt).total
        if peak_flops:
            return lower_bound(cost, peak_flops, bandwidth_bps).time_s
        return cost.bytes / bandwidth_bps
    return float(m.active_params or m.params) * dt.weight / bandwidth_bps
