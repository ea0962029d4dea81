"""Workloads: seeded random prompts of an exact token length, or prompts from a JSONL file.

Random prompts are exact under the run's tokenizer:

* built-in tokenizer: ``BuiltinTokenizer.random_text`` over seeded word indices (one word,
  one token, by construction);
* Hugging Face tokenizer: sample token ids, decode, re-encode, then trim or pad with more
  sampled ids and repeat until the re-encoded length is exact (as vLLM's random dataset
  does, but never accepting a near miss).

JSONL: one object per line, ``{"prompt": "..."}`` or ``{"messages": [...]}``, optionally
``"output_len": N``. Blank lines are skipped; anything else is a ``ValueError`` naming the
line. When the file has fewer prompts than asked for, it is cycled.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.domain import RunSpec
from app.loadgen.tokenizer import WORDS, BuiltinTokenizer, HFTokenizer

AnyTokenizer = BuiltinTokenizer | HFTokenizer


@dataclass(frozen=True, slots=True)
class Prompt:
    prompt: str | None  # text prompt (completions, or a single user message for chat)
    messages: list[dict[str, Any]] | None  # chat messages from a JSONL file
    input_tokens: int  # by the client's tokenizer (for messages: their contents)
    output_len: int


def random_prompt_text(tok: AnyTokenizer, n_tokens: int, rng: np.random.Generator) -> str:
    """A random text of exactly ``n_tokens`` tokens under ``tok``."""
    if isinstance(tok, BuiltinTokenizer):
        idx = rng.integers(0, len(WORDS), size=n_tokens).tolist()
        return tok.random_text(n_tokens, idx)
    return _hf_random_text(tok, n_tokens, rng)


def _hf_random_text(tok: HFTokenizer, n_tokens: int, rng: np.random.Generator) -> str:
    vocab = tok.vocab_size
    for _attempt in range(8):
        ids = rng.integers(0, vocab, size=n_tokens).tolist()
        for _ in range(32):
            text = tok.decode(ids)
            ids = tok.encode(text)
            if len(ids) == n_tokens:
                return text
            if len(ids) > n_tokens:
                ids = ids[:n_tokens]
            else:
                ids = ids + rng.integers(0, vocab, size=n_tokens - len(ids)).tolist()
    raise ValueError(
        f"could not build a prompt of exactly {n_tokens} tokens with {tok.name} "
        "(decode/re-encode never converged)"
    )


def random_prompts(
    tok: AnyTokenizer, n: int, input_len: int, output_len: int, rng: np.random.Generator
) -> list[Prompt]:
    return [
        Prompt(random_prompt_text(tok, input_len, rng), None, input_len, output_len)
        for _ in range(n)
    ]


def _parse_line(line: str, lineno: int, path: str, tok: AnyTokenizer, out_len: int) -> Prompt:
    where = f"{path}:{lineno}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a JSON object with 'prompt' or 'messages'")
    ol = obj.get("output_len", out_len)
    if not isinstance(ol, int) or isinstance(ol, bool) or ol < 1:
        raise ValueError(f"{where}: 'output_len' must be a positive integer")
    if "prompt" in obj:
        p = obj["prompt"]
        if not isinstance(p, str) or not p:
            raise ValueError(f"{where}: 'prompt' must be a non-empty string")
        return Prompt(p, None, tok.count(p), ol)
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise ValueError(f"{where}: 'messages' must be a non-empty list")
        n_in = 0
        for m in msgs:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ValueError(f"{where}: each message needs a 'role' and 'content'")
            c = m.get("content")
            if isinstance(c, str):
                n_in += tok.count(c)
            elif c is not None and not isinstance(c, list):
                raise ValueError(f"{where}: message 'content' must be a string or a list")
        return Prompt(None, msgs, n_in, ol)
    raise ValueError(f"{where}: expected a 'prompt' or 'messages' key")


def load_jsonl(path: str, tok: AnyTokenizer, default_output_len: int) -> list[Prompt]:
    out: list[Prompt] = []
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                out.append(_parse_line(line, lineno, path, tok, default_output_len))
    if not out:
        raise ValueError(f"{path}: no prompts in file")
    return out


@dataclass(frozen=True, slots=True)
class Workload:
    warmup: list[Prompt]
    measured: list[Prompt]


def build_workload(spec: RunSpec, tok: AnyTokenizer) -> Workload:
    """Prompts for a run: warm-ups come from a separate seeded stream (random) or from the
    end of the file (JSONL), so the measured prompts do not depend on the warm-up count."""
    if spec.dataset == "random":
        rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 0]))
        measured = random_prompts(tok, spec.num_prompts, spec.input_len, spec.output_len, rng)
        wrng = np.random.default_rng(np.random.SeedSequence([spec.seed, 2]))
        warm = random_prompts(tok, spec.warmup_requests, spec.input_len, spec.output_len, wrng)
        return Workload(warm, measured)
    assert spec.dataset_path is not None
    items = load_jsonl(spec.dataset_path, tok, spec.output_len)
    measured = [items[i % len(items)] for i in range(spec.num_prompts)]
    warm = [items[-1 - (i % len(items))] for i in range(spec.warmup_requests)]
    return Workload(warm, measured)
