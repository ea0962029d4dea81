"""``batch_scaling``: a real causal LM (a local Hugging Face folder, a ``.gguf`` file read
through transformers, or ``random:tiny-llama``) at fixed input and output lengths over
batch sizes. TTFT is measured at the first generated token (device-synchronized), TPOT over
the remaining tokens; greedy decoding for exactly ``output_len`` tokens (EOS ignored)."""

from __future__ import annotations

import importlib
import inspect
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.analysis.knee import find_knee
from app.probes.device import ProbeError, import_torch, synchronize
from app.probes.device_telemetry import Sampler, window
from app.probes.spec import RANDOM_TINY_LLAMA, BatchScalingParams

TINY_LLAMA = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}


def load_model(path: str, dtype: str, dev: Any, seed: int) -> tuple[Any, str]:
    """The model on ``dev`` in eval mode, and a description of where it came from."""
    torch = import_torch()
    try:
        transformers: Any = importlib.import_module("transformers")
    except ImportError:
        raise ProbeError(
            "transformers is not installed on this worker: pip install 'tokentrace[probes]'"
        ) from None
    tdt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    if path == RANDOM_TINY_LLAMA:
        torch.manual_seed(seed)
        cfg = transformers.LlamaConfig(**TINY_LLAMA)
        model = transformers.LlamaForCausalLM(cfg).to(dtype=tdt)
        source = "random-weight Llama built from a tiny config (mechanics, not a real model)"
    else:
        p = Path(path).expanduser()
        if p.is_file() and p.suffix == ".gguf":
            try:
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    str(p.parent), gguf_file=p.name, dtype=tdt
                )
            except Exception as e:
                raise ProbeError(f"cannot load GGUF {p}: {type(e).__name__}: {e}") from None
            source = f"GGUF {p} (dequantized by transformers to {dtype})"
        elif p.is_dir():
            try:
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    str(p), dtype=tdt, local_files_only=True
                )
            except Exception as e:
                raise ProbeError(f"cannot load model from {p}: {type(e).__name__}: {e}") from None
            source = f"Hugging Face folder {p}"
        else:
            raise ProbeError(
                f"model_path {path!r}: not a local folder, a .gguf file or {RANDOM_TINY_LLAMA!r}"
            )
    model = model.to(dev).eval()
    return model, source


class _Clock:
    """Marks on the device timeline (CUDA events) or the host clock (CPU: synchronous)."""

    def __init__(self, dev: Any) -> None:
        self.dev = dev
        self.torch = import_torch()

    def mark(self) -> Any:
        if self.dev.type == "cuda":
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter_ns()

    def ms(self, a: Any, b: Any) -> float:
        if self.dev.type == "cuda":
            return float(a.elapsed_time(b))
        return float(b - a) / 1e6


def _cache_arg(model: Any) -> str:
    """transformers >= 5.x names the KV cache ``cache``; earlier versions
    ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def generate(model: Any, ids: Any, output_len: int, clock: _Clock) -> tuple[float, float, float]:
    """Greedy decode of ``output_len`` tokens: (ttft_ms, tpot_ms, total_ms)."""
    torch = clock.torch
    arg = _cache_arg(model)
    with torch.inference_mode():
        synchronize(clock.dev)
        t0 = clock.mark()
        out = model(input_ids=ids, use_cache=True)
        past = out[arg]
        nxt = out.logits[:, -1:].argmax(-1)
        t1 = clock.mark()
        for _ in range(output_len - 1):
            out = model(input_ids=nxt, use_cache=True, **{arg: past})
            past = out[arg]
            nxt = out.logits[:, -1:].argmax(-1)
        t2 = clock.mark()
        synchronize(clock.dev)
    ttft, total = clock.ms(t0, t1), clock.ms(t0, t2)
    return ttft, (total - ttft) / (output_len - 1), total


def run(
    dev: Any,
    p: BatchScalingParams,
    stop: Callable[[], bool],
    sampler: Sampler | None = None,
) -> dict[str, Any]:
    torch = import_torch()
    model, source = load_model(p.model_path, p.dtype, dev, p.seed)
    n_params = int(sum(t.numel() for t in model.parameters()))
    vocab = int(model.config.vocab_size)
    gen = torch.Generator().manual_seed(p.seed)
    clock = _Clock(dev)
    warm = torch.randint(0, vocab, (1, min(p.input_len, 8)), generator=gen).to(dev)
    generate(model, warm, 2, clock)  # warm-up: kernels, allocator, lazy init
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for b in p.batches:
        if stop():
            notes.append(f"stopped before batch {b}")
            break
        ids = torch.randint(0, vocab, (b, p.input_len), generator=gen).to(dev)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        w0 = sampler.now_s() if sampler else 0.0
        try:
            ttft, tpot, total = generate(model, ids, p.output_len, clock)
        except torch.cuda.OutOfMemoryError:
            notes.append(f"batch {b}: out of device memory; larger batches not tried")
            rows.append({"batch": b, "error": "out of memory"})
            break
        w1 = sampler.now_s() if sampler else 0.0
        row: dict[str, Any] = {
            "batch": b,
            "ttft_ms": ttft,
            "tpot_ms": tpot,
            "total_ms": total,
            "tokens_per_s": b * p.output_len / (total / 1e3),
            "per_request_tokens_per_s": p.output_len / (total / 1e3),
            "decode_tokens_per_s": b / (tpot / 1e3),
            "decode_flops_s": 2.0 * n_params * b / (tpot / 1e3),
            "peak_memory_bytes": (
                float(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else None
            ),
        }
        if sampler is not None:
            tele = window([*sampler.samples, sampler.sample()], w0, w1)
            row |= {"util_pct": tele["util_pct_mean"], "power_w": tele["power_w_mean"]}
        else:
            row |= {"util_pct": None, "power_w": None}
        rows.append(row)
    ok = [r for r in rows if "error" not in r]
    knee = find_knee(
        [r["batch"] for r in ok],
        [r["tokens_per_s"] for r in ok],
        utilization=[r["util_pct"] for r in ok] if sampler is not None else None,
    )
    if dev.type == "cpu":
        notes.append("CPU run: no device memory peak, utilization or power is measured")
    return {
        "model_path": p.model_path,
        "model_source": source,
        "parameters": n_params,
        "input_len": p.input_len,
        "output_len": p.output_len,
        "dtype": p.dtype,
        "rows": rows,
        "knee": {
            "batch": knee.batch,
            "efficiencies": knee.efficiencies,
            "explanation": knee.explanation,
        },
        "notes": notes,
    }
