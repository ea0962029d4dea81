"""Dataset type ``weka``: the WEKA agentic-coding trace format (KV-cache-tester captures,
as published in the ``cc-traces-weka-*`` corpora), replayed as an agent trace
(``agent_graph``, ``app.client.agent_sessions``).

The file: one trace object (``.json``), a JSON list of them, or one per line (JSONL: the
rows of a corpus). A trace::

    {"id": "s1", "block_size": 64, "hash_id_scope": "local", "requests": [
      {"t": 0.0, "type": "s", "in": 900, "out": 40, "hash_ids": [1, 2, ...], "api_time": 1.2},
      {"t": 1.5, "type": "subagent", "agent_id": "a1", "status": "completed",
       "duration_ms": 2100, "requests": [{"t": 1.6, "type": "n", "in": 300, ...}]},
      {"t": 3.9, "type": "s", "in": 1400, "out": 12, "hash_ids": [1, 2, ...], "think_time": 0.3}]}

* A trace is a session; sessions all start at the run's start (the traces carry no common
  clock), ``num_prompts`` takes the first N. ``t`` is seconds from the conversation's start.
* Its requests (``type`` ``n`` or ``s``) form a chain: each waits for the one before it in
  its list. A ``subagent`` marker's inner ``requests`` are a chain of their own whose first
  waits for the request before the marker (its spawner); the request after the marker also
  waits for the subagent's last request, unless the marker's ``status`` is
  ``async_launched`` (launched in the background: nobody waits). Markers nest.
* A request's delay is its ``think_time`` (s) when given, else the recorded gap: its ``t``
  minus its parents' latest recorded end (a request's ``t`` + ``api_time``; a subagent's
  ``t`` + ``duration_ms``, else its last request's end); a session's first request waits
  its own ``t``. Divided by ``--trace-speedup``.
* The prompt is synthesized, as the captures hold no text: one block of ``block_size``
  tokens per hash id (the same text for an id wherever it appears: ``global`` scope across
  the traces, ``local`` within one), its first ``in`` tokens; tokens past the blocks the
  ids cover are the request's own. It is sent as one user message; the block structure
  already stands for the earlier turns, so no actual reply is carried in. ``out`` is
  max_tokens (0 asks 1). The recorded ``model`` is kept for reference; the run's is sent.

Refused naming the trace, the request and the field: a trace without ``requests``, an
unknown ``type``, a missing or negative ``t``, ``in`` or ``out``, ``t`` earlier than the
request before it in its chain, a negative ``think_time`` / ``api_time`` /
``duration_ms``, a ``hash_ids`` entry that is not a non-negative integer, a non-positive
``block_size``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from app.client.datasets.agent_graph import RawNode, graph_of
from app.client.datasets.agentic import NO_WARMUPS, AgentTraceOptions, trace_workload
from app.client.datasets.base import (
    MAX_PROMPT_TOKENS,
    AnyTokenizer,
    BuildContext,
    FileDigest,
    Workload,
    WorkloadParams,
    check_cancel,
    read_dataset,
)
from app.client.datasets.mooncake import MAX_LENGTH, BlockPrompts
from app.client.tokenizer import BuiltinTokenizer

MAX_NESTING = 32  # subagents within subagents
MAX_BLOCK_SIZE = 1 << 16
# BlockPrompts streams: the global namespace, then per trace k its local one and its own
# (tokens past a request's recorded blocks); 2**30 traces apart
GLOBAL_STREAM = 3
LOCAL_STREAM = 1 << 30
OWN_STREAM = 2 << 30


@dataclass(frozen=True, slots=True)
class _Req:
    """One request as the trace gives it, checked; its node number and recorded end."""

    node: int
    t: float
    end: float


def _where(trace: int, tid: str, path: str) -> str:
    return f"dataset_path trace {trace} ({tid!r}) {path}"


def _num(obj: dict[str, Any], key: str, where: str, *, required: bool) -> float | None:
    v = obj.get(key)
    if v is None:
        if required:
            raise ValueError(f"{where}: '{key}' is required (a number >= 0)")
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise ValueError(f"{where}: '{key}' must be a number >= 0, got {v!r}")
    return float(v)


def _count(obj: dict[str, Any], key: str, where: str) -> int:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_LENGTH:
        raise ValueError(f"{where}: '{key}' must be an integer from 0 to {MAX_LENGTH:,}")
    return v


def _hash_ids(obj: dict[str, Any], where: str) -> list[int]:
    ids = obj.get("hash_ids", [])
    if not isinstance(ids, list):
        raise ValueError(f"{where}: 'hash_ids' must be a list of integers >= 0")
    for h in ids:
        if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < 2**63:
            raise ValueError(f"{where}: 'hash_ids' must hold integers >= 0, got {h!r}")
    return ids


class _Builder:
    """One trace's requests walked into ``RawNode``s (a session)."""

    def __init__(self, tok: AnyTokenizer, seed: int, default_out: int) -> None:
        self.tok = tok
        self.seed = seed
        self.default_out = default_out
        self.nodes: list[RawNode] = []
        self.tokens = 0
        self.ids: set[str] = set()
        self.block_sets: dict[tuple[int, int], BlockPrompts] = {}

    def _shared(self, size: int, stream: int) -> BlockPrompts:
        key = (size, stream)
        got = self.block_sets.get(key)
        if got is None:
            got = self.block_sets[key] = BlockPrompts(self.tok, size, self.seed, stream)
        return got

    def trace(self, k: int, obj: dict[str, Any]) -> None:
        tid = obj.get("id", f"trace-{k}")
        if isinstance(tid, bool) or not isinstance(tid, str | int) or tid == "":
            raise ValueError(f"dataset_path trace {k}: 'id' must be a non-empty string")
        tid = str(tid)
        size = obj.get("block_size", 64)
        if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_BLOCK_SIZE:
            raise ValueError(
                f"{_where(k, tid, 'block_size')}: an integer from 1 to {MAX_BLOCK_SIZE}"
            )
        scope = obj.get("hash_id_scope", "local")
        if scope not in ("local", "global"):
            raise ValueError(f"{_where(k, tid, 'hash_id_scope')}: 'local' or 'global'")
        reqs = obj.get("requests")
        if not isinstance(reqs, list) or not reqs:
            raise ValueError(f"{_where(k, tid, 'requests')}: a non-empty list is required")
        if tid in self.ids:
            raise ValueError(f"{_where(k, tid, 'id')}: given to an earlier trace as well")
        self.ids.add(tid)
        self._k, self._tid, self._size = k, tid, size
        # one block text per hash id: across the traces (global), or within this one (local)
        stream = GLOBAL_STREAM if scope == "global" else LOCAL_STREAM + k
        self._blocks = self._shared(size, stream)
        self._own = self._shared(size, OWN_STREAM + k)
        self._chain(reqs, "requests", spawner=None, depth=0)

    def _chain(self, reqs: list[Any], path: str, spawner: _Req | None, depth: int) -> _Req | None:
        """The requests of one agent, in order; the last request (None: none)."""
        if depth > MAX_NESTING:
            raise ValueError(f"{_where(self._k, self._tid, path)}: subagents nest too deeply")
        prev = spawner
        waits: list[tuple[int, float]] = []  # subagents the next request waits for
        last_t = spawner.t if spawner is not None else 0.0
        for i, r in enumerate(reqs):
            where = _where(self._k, self._tid, f"{path}[{i}]")
            if not isinstance(r, dict):
                raise ValueError(f"{where}: expected a JSON object")
            kind = r.get("type")
            t = _num(r, "t", where, required=True)
            assert t is not None
            if t < last_t:
                raise ValueError(
                    f"{where}: 't' {t:g} s is earlier than the request before it ({last_t:g} s)"
                )
            last_t = t
            if kind == "subagent":
                inner = r.get("requests", [])
                if not isinstance(inner, list):
                    raise ValueError(f"{where}: 'requests' must be a list")
                duration = _num(r, "duration_ms", where, required=False)
                end = self._chain(inner, f"{path}[{i}].requests", prev, depth + 1)
                if end is not None and r.get("status") != "async_launched":
                    done = t + duration / 1000.0 if duration is not None else end.end
                    waits.append((end.node, done))
                continue
            if kind not in ("n", "s"):
                raise ValueError(f"{where}: 'type' must be 'n', 's' or 'subagent', got {kind!r}")
            parents = ([(prev.node, prev.end)] if prev is not None else []) + waits
            waits = []
            prev = self._request(r, where, t, parents)
        return prev

    def _request(
        self, r: dict[str, Any], where: str, t: float, parents: list[tuple[int, float]]
    ) -> _Req:
        n_in = _count(r, "in", where)
        out = _count(r, "out", where)
        ids = _hash_ids(r, where)
        think = _num(r, "think_time", where, required=False)
        api = _num(r, "api_time", where, required=False)
        if think is not None:
            delay_s = think
        else:
            after = max((e for _, e in parents), default=0.0)
            delay_s = max(0.0, t - after)
        node = len(self.nodes)
        text = self._prompt(ids, n_in, node)
        self.tokens += n_in
        if self.tokens > MAX_PROMPT_TOKENS:
            raise ValueError(
                f"dataset_path: the traces hold over {MAX_PROMPT_TOKENS:,} prompt tokens, "
                "the client's budget"
            )
        self.nodes.append(
            RawNode(
                lineno=node + 1,
                session_id=self._tid,
                request_id=str(node),
                parent_ids=tuple(str(p) for p, _ in parents),
                delay_ms=delay_s * 1000.0,
                messages=({"role": "user", "content": text},),
                output_len=max(1, out) if "out" in r else self.default_out,
                where=f"dataset_path trace {self._k} request",
            )
        )
        return _Req(node, t, t + (api or 0.0))

    def _prompt(self, ids: list[int], n_in: int, node: int) -> str:
        """``n_in`` tokens: the blocks of ``ids``, then tokens of this request alone."""
        size = self._size
        blocks = self._blocks
        parts: list[str] = []
        left = n_in
        for h in ids:
            if left <= 0:
                break
            take = min(left, size)
            parts.append(blocks.block_text(h, take))
            left -= take
        j = 0
        while left > 0:  # past the recorded blocks: blocks no other request has
            take = min(left, size)
            parts.append(self._own.block_text(((node << 24) + j) & (2**63 - 1), take))
            left -= take
            j += 1
        if isinstance(self.tok, BuiltinTokenizer):
            return " ".join(parts)  # one word one token: exactly ``in`` tokens
        return "".join(parts)


def _traces(data: bytes) -> list[Any]:
    """The trace objects of the file: one object, a list, or one per line."""
    text = data.decode("utf-8", errors="strict")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        obj = None
    except (RecursionError, ValueError) as e:
        raise ValueError(f"dataset_path: not valid JSON ({str(e)[:80]})") from None
    if isinstance(obj, dict):
        return [obj]
    if isinstance(obj, list):
        return obj
    out: list[Any] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except (ValueError, RecursionError) as e:
            why = str(e)[:80]
            raise ValueError(f"dataset_path line {lineno}: not valid JSON ({why})") from None
    return out


class WekaDataset:
    name = "weka"
    summary = (
        "a WEKA agentic-coding trace (JSON or JSONL of traces: requests with t, in, out, "
        "hash_ids; subagent markers): each request sent when its chain allows, prompts "
        "synthesized from the KV-cache blocks"
    )
    options: type[BaseModel] = AgentTraceOptions
    timed = True
    conversation = True  # it sends chat messages: a conversation surface only

    def check(self, params: WorkloadParams, options: BaseModel) -> None:
        if not params.dataset_path:
            raise ValueError(f"dataset_path is required when dataset is {self.name!r}")
        if params.warmup_requests:
            raise ValueError(NO_WARMUPS)

    def prompt_tokens(self, params: WorkloadParams, options: BaseModel) -> int | None:
        return None  # bounded while building (MAX_PROMPT_TOKENS)

    def build(self, params: WorkloadParams, options: BaseModel, ctx: BuildContext) -> Workload:
        assert isinstance(options, AgentTraceOptions) and params.dataset_path is not None
        digest = FileDigest()
        data = read_dataset(params.dataset_path, ctx.dataset_dirs)
        digest.update(data)
        try:
            traces = _traces(data)
        except UnicodeDecodeError:
            raise ValueError("dataset_path: not UTF-8 text") from None
        if params.num_prompts is not None:
            if params.num_prompts > len(traces):
                raise ValueError(
                    f"num_prompts: {params.num_prompts} sessions requested, the file has "
                    f"{len(traces)} traces"
                )
            traces = traces[: params.num_prompts]
        b = _Builder(ctx.tokenizer, params.seed, params.output_len)
        for k, obj in enumerate(traces, 1):
            check_cancel(ctx.cancelled, k)
            if not isinstance(obj, dict):
                raise ValueError(f"dataset_path trace {k}: expected a JSON object")
            b.trace(k, obj)
        trace = graph_of(b.nodes, options.speedup)
        return trace_workload(trace, ctx.tokenizer, digest.source(), options.speedup)


WEKA = WekaDataset()
