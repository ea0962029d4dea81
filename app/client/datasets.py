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

A dataset file is hostile input when a run names it on a worker: ``open_dataset`` takes
only regular files (no devices, FIFOs or directories) inside the worker's configured
directories, at most ``MAX_DATASET_BYTES``, and its errors name the run's field, never what
exists on the worker's file system. Building is cancellable (``cancelled`` is polled every
``CANCEL_CHECK_EVERY`` prompts).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.client.tokenizer import WORDS, BuiltinTokenizer, HFTokenizer
from app.domain import RunSpec

AnyTokenizer = BuiltinTokenizer | HFTokenizer
MAX_DATASET_BYTES = 512 << 20
CANCEL_CHECK_EVERY = 256
REFUSED = (
    "dataset_path: not a dataset file this worker may read (a regular file inside its "
    "dataset directories: TOKENTRACE_DATASET_DIRS or --dataset-dir)"
)


class WorkloadCancelled(Exception):
    """The run was cancelled while its prompts were being built."""


def _check_cancel(cancelled: Callable[[], bool] | None, i: int) -> None:
    if cancelled is not None and i % CANCEL_CHECK_EVERY == 0 and cancelled():
        raise WorkloadCancelled("cancelled while building the workload")


def open_dataset(path: str, dirs: Sequence[str] | None) -> Iterator[str]:
    """The lines of a dataset file. ``dirs`` None: any file the process can read (the local
    CLI's own files); else only a regular file inside one of ``dirs`` (symlinks resolved).
    Every refusal reads the same, whatever the reason (missing, elsewhere, a device)."""
    if dirs is not None:
        try:
            real = os.path.realpath(path, strict=True)
        except (OSError, ValueError):
            raise ValueError(REFUSED) from None
        roots = [os.path.realpath(d) for d in dirs]
        if not any(os.path.commonpath([real, r]) == r for r in roots):
            raise ValueError(REFUSED)
        path = real
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
    except (OSError, ValueError) as e:
        if dirs is not None:
            raise ValueError(REFUSED) from None
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ValueError(f"dataset_path: cannot open {path!r}: {reason}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(REFUSED if dirs is not None else "dataset_path: not a regular file")
        if st.st_size > MAX_DATASET_BYTES:
            raise ValueError(
                f"dataset_path: the file is larger than {MAX_DATASET_BYTES >> 20} MiB"
            )
        os.set_blocking(fd, True)
        f = os.fdopen(fd, encoding="utf-8", errors="strict")
    except BaseException:
        os.close(fd)
        raise
    with f:
        read = 0
        try:
            for line in f:
                read += len(line)
                if read > MAX_DATASET_BYTES:  # it grew while being read
                    raise ValueError(
                        f"dataset_path: the file is larger than {MAX_DATASET_BYTES >> 20} MiB"
                    )
                yield line
        except UnicodeDecodeError:
            raise ValueError("dataset_path: the file is not UTF-8 text") from None


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
    tok: AnyTokenizer,
    n: int,
    input_len: int,
    output_len: int,
    rng: np.random.Generator,
    cancelled: Callable[[], bool] | None = None,
) -> list[Prompt]:
    out = []
    for i in range(n):
        _check_cancel(cancelled, i)
        out.append(Prompt(random_prompt_text(tok, input_len, rng), None, input_len, output_len))
    return out


def _parse_line(line: str, lineno: int, tok: AnyTokenizer, out_len: int) -> Prompt:
    where = f"dataset_path line {lineno}"
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


def load_jsonl(
    path: str,
    tok: AnyTokenizer,
    default_output_len: int,
    *,
    dirs: Sequence[str] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> list[Prompt]:
    out: list[Prompt] = []
    for lineno, line in enumerate(open_dataset(path, dirs), start=1):
        _check_cancel(cancelled, lineno)
        if line.strip():
            out.append(_parse_line(line, lineno, tok, default_output_len))
    if not out:
        raise ValueError("dataset_path: no prompts in the file")
    return out


@dataclass(frozen=True, slots=True)
class Workload:
    warmup: list[Prompt]
    measured: list[Prompt]


def build_workload(
    spec: RunSpec,
    tok: AnyTokenizer,
    *,
    dataset_dirs: Sequence[str] | None = None,
    cancelled: Callable[[], bool] | None = None,
) -> Workload:
    """Prompts for a run: warm-ups come from a separate seeded stream (random) or from the
    end of the file (JSONL), so the measured prompts do not depend on the warm-up count.
    ``dataset_dirs``: see ``open_dataset``; ``cancelled``: polled, ``WorkloadCancelled``."""
    if spec.dataset == "random":
        rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 0]))
        measured = random_prompts(
            tok, spec.num_prompts, spec.input_len, spec.output_len, rng, cancelled
        )
        wrng = np.random.default_rng(np.random.SeedSequence([spec.seed, 2]))
        warm = random_prompts(
            tok, spec.warmup_requests, spec.input_len, spec.output_len, wrng, cancelled
        )
        return Workload(warm, measured)
    assert spec.dataset_path is not None
    items = load_jsonl(
        spec.dataset_path, tok, spec.output_len, dirs=dataset_dirs, cancelled=cancelled
    )
    measured = [items[i % len(items)] for i in range(spec.num_prompts)]
    warm = [items[-1 - (i % len(items))] for i in range(spec.warmup_requests)]
    return Workload(warm, measured)
