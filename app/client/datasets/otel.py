"""Dataset type ``otel``: OpenTelemetry GenAI spans (JSONL, one span per line) replayed as
an agent trace (``agent_graph``, ``app.client.agent_sessions``).

A span: ``trace_id``, ``span_id``, ``parent_span_id`` (optional), ``start_time_unix_nano``,
``end_time_unix_nano`` (integers, or strings of digits as OTLP JSON writes them) and
``attributes``, an object or OTLP's list of ``{"key", "value": {"stringValue" | "intValue"
| "doubleValue" | "boolValue"}}``. The GenAI attributes read: ``gen_ai.operation.name``,
``gen_ai.input.messages`` (a list, or its JSON text: ``{"role", "content"}`` or
``{"role", "parts": [{"type": "text", "content"}]}``) or ``gen_ai.prompt`` (a string),
``gen_ai.usage.output_tokens`` (else ``gen_ai.request.max_tokens``, else the run's
``output_len``); ``gen_ai.request.model`` and ``gen_ai.usage.input_tokens`` are kept for
reference only (the run's model is sent).

* An LLM call is a span whose ``gen_ai.operation.name`` is ``chat``, ``text_completion`` or
  ``generate_content``; it becomes one request. Other spans (``execute_tool``,
  ``invoke_agent``, ...) send nothing: their time shows in the gaps.
* A session is a trace (``trace_id``); sessions start in the order of their first span's
  start, at its offset from the first trace's.
* The dependency rule: a request's parents are the LLM spans of its trace that ended before
  it started and after which no other such span both started and ended before it started
  (the immediate predecessors in "ended before started"): a chain's previous call, and
  after a fan-out every parallel branch's last call (a join). A span with none is a root.
* Its delay is the recorded gap: its start minus its parents' latest end (a root: minus
  its trace's first span's start). The span's recorded messages are sent as they are (the
  recorded replies stay in them; no actual reply is carried in).

Refused naming the line and field: a missing or non-integer time, an end before its
start, a span id given twice in a trace, an LLM span without messages or prompt, a parent
span id that appears nowhere in its trace.
"""

from __future__ import annotations

import bisect
import json
from typing import Any

from pydantic import BaseModel

from app.client.datasets.agent_graph import RawNode, graph_of
from app.client.datasets.agentic import NO_WARMUPS, AgentTraceOptions, trace_workload
from app.client.datasets.base import (
    BuildContext,
    FileDigest,
    Workload,
    WorkloadParams,
    check_cancel,
    json_object_line,
    open_dataset,
)
from app.client.datasets.jsonl import output_len_of

LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
MAX_NS = 2**63 - 1


def _attributes(obj: dict[str, Any], where: str) -> dict[str, Any]:
    raw = obj.get("attributes", {})
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, list):
        raise ValueError(f"{where}: 'attributes' must be an object or a list of key/value")
    out: dict[str, Any] = {}
    for a in raw:
        if not isinstance(a, dict) or not isinstance(a.get("key"), str):
            raise ValueError(f"{where}: 'attributes': each item needs a 'key' and a 'value'")
        v = a.get("value")
        if isinstance(v, dict) and len(v) == 1:
            ((kind, val),) = v.items()
            if kind == "intValue" and isinstance(val, str) and val.lstrip("-").isdigit():
                val = int(val)
            out[a["key"]] = val
        else:
            out[a["key"]] = v
    return out


def _time(obj: dict[str, Any], key: str, where: str) -> int:
    v = obj.get(key)
    if isinstance(v, str) and v.isdigit():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_NS:
        raise ValueError(f"{where}: '{key}' is required: an integer of ns since the epoch")
    return v


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _messages(attrs: dict[str, Any], where: str) -> list[dict[str, Any]]:
    raw = attrs.get("gen_ai.input.messages")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raise ValueError(
                f"{where}: 'attributes.gen_ai.input.messages' is not a JSON list"
            ) from None
    if raw is None:
        prompt = attrs.get("gen_ai.prompt")
        if isinstance(prompt, str) and prompt:
            return [{"role": "user", "content": prompt}]
        raise ValueError(
            f"{where}: 'attributes.gen_ai.input.messages' (or 'gen_ai.prompt') is required on "
            "an LLM span"
        )
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{where}: 'attributes.gen_ai.input.messages' must be a non-empty list")
    out: list[dict[str, Any]] = []
    for k, m in enumerate(raw):
        role = m.get("role") if isinstance(m, dict) else None
        if not isinstance(role, str):
            raise ValueError(f"{where}: 'attributes.gen_ai.input.messages' item {k + 1}: no role")
        content = _text(m.get("content"))
        if content is None and isinstance(m.get("parts"), list):
            texts = [_text(p.get("content")) for p in m["parts"] if isinstance(p, dict)]
            content = "".join(t for t in texts if t)
        if content is None:
            raise ValueError(
                f"{where}: 'attributes.gen_ai.input.messages' item {k + 1}: no text content"
            )
        out.append({"role": role, "content": content})
    return out


class _Span:
    __slots__ = ("attrs", "end", "lineno", "parent", "span_id", "start", "trace_id")

    def __init__(self, obj: dict[str, Any], lineno: int) -> None:
        where = f"dataset_path line {lineno}"
        self.lineno = lineno
        self.trace_id = _id(obj, "trace_id", where)
        self.span_id = _id(obj, "span_id", where)
        parent = obj.get("parent_span_id")
        self.parent = str(parent) if parent not in (None, "") else None
        self.start = _time(obj, "start_time_unix_nano", where)
        self.end = _time(obj, "end_time_unix_nano", where)
        if self.end < self.start:
            raise ValueError(
                f"{where}: 'end_time_unix_nano' is before 'start_time_unix_nano' (a span "
                "cannot end before it starts)"
            )
        self.attrs = _attributes(obj, where)


def _id(obj: dict[str, Any], key: str, where: str) -> str:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, str | int) or v == "":
        raise ValueError(f"{where}: '{key}' is required: a non-empty string")
    return str(v)


def _is_llm(s: _Span) -> bool:
    return s.attrs.get("gen_ai.operation.name") in LLM_OPERATIONS


def _maximal(spans: list[tuple[int, int]], cands: list[int]) -> tuple[int, ...]:
    """The rule by its definition (a span of no length's own case): the candidates P after
    whose end no other candidate started."""
    return tuple(
        sorted(p for p in cands if not any(q != p and spans[q][0] >= spans[p][1] for q in cands))
    )


def parents_by_interval(spans: list[tuple[int, int]]) -> list[tuple[int, ...]]:
    """For spans ``(start, end)``: each one's parents by the module's rule (indices, in
    ascending order): of the spans that ended by its start (its candidates), those after
    whose end no other candidate started. Sorted by end, the candidates are a prefix, and
    its parents that prefix's tail that ended after its latest start (with a span of no
    length at that latest start when it alone starts there): O(n log n) plus the parents."""
    order = sorted(range(len(spans)), key=lambda k: spans[k][1])
    ends = [spans[k][1] for k in order]
    latest: list[int] = []  # the latest start among order[: i + 1]
    at_latest: list[int] = []  # how many of them start there
    for k in order:
        s0 = spans[k][0]
        if not latest or s0 > latest[-1]:
            latest.append(s0)
            at_latest.append(1)
        else:
            latest.append(latest[-1])
            at_latest.append(at_latest[-1] + (s0 == latest[-1]))
    out: list[tuple[int, ...]] = []
    for k, (start, end) in enumerate(spans):
        i = bisect.bisect_right(ends, start)  # candidates: order[:i]
        if end <= start:  # a span of no length is among its own candidates: left out
            out.append(_maximal(spans, [c for c in order[:i] if c != k]))
            continue
        if i == 0:
            out.append(())
            continue
        top = latest[i - 1]
        lo = bisect.bisect_left(ends, top, 0, i)
        hi = bisect.bisect_right(ends, top, 0, i)
        found = order[hi:i]
        if at_latest[i - 1] == 1:  # a span of no length alone at the latest start
            found += [c for c in order[lo:hi] if spans[c][0] == top]
        out.append(tuple(sorted(found)))
    return out


def spans_to_nodes(spans: list[_Span], default_out: int) -> list[RawNode]:
    """The LLM spans as requests (by trace, ordered by start), with their parents and
    delays by the module's rules."""
    by_trace: dict[str, list[_Span]] = {}
    for s in spans:
        by_trace.setdefault(s.trace_id, []).append(s)
    nodes: list[RawNode] = []
    traces = sorted(by_trace.values(), key=lambda ss: min(s.start for s in ss))
    for ss in traces:
        ids: dict[str, _Span] = {}
        for s in ss:
            if s.span_id in ids:
                raise ValueError(
                    f"dataset_path line {s.lineno}: 'span_id' {s.span_id!r} is given twice in "
                    f"trace {s.trace_id!r} (first on line {ids[s.span_id].lineno})"
                )
            ids[s.span_id] = s
        for s in ss:
            if s.parent is not None and s.parent not in ids:
                raise ValueError(
                    f"dataset_path line {s.lineno}: 'parent_span_id' {s.parent!r} is no span "
                    f"of trace {s.trace_id!r}"
                )
        llm = sorted((s for s in ss if _is_llm(s)), key=lambda s: (s.start, s.lineno))
        if not llm:
            continue
        t0 = min(s.start for s in ss)
        parents = parents_by_interval([(s.start, s.end) for s in llm])
        for k, s in enumerate(llm):
            where = f"dataset_path line {s.lineno}"
            ps = parents[k]
            ready = max((llm[p].end for p in ps), default=t0)
            out_len = s.attrs.get("gen_ai.usage.output_tokens")
            if out_len is None:
                out_len = s.attrs.get("gen_ai.request.max_tokens")
            given = {"output_len": out_len} if out_len is not None else {}
            field = f"{where}: 'attributes.gen_ai.usage.output_tokens'"
            ol = output_len_of(given, field, default_out)
            nodes.append(
                RawNode(
                    lineno=s.lineno,
                    session_id=s.trace_id,
                    request_id=s.span_id,
                    parent_ids=tuple(llm[p].span_id for p in ps),
                    delay_ms=(s.start - ready) / 1e6,
                    messages=tuple(_messages(s.attrs, where)),
                    output_len=ol,
                    timestamp_ms=(t0 - min(x.start for x in traces[0])) / 1e6,
                )
            )
    return nodes


class OtelDataset:
    name = "otel"
    summary = (
        "OpenTelemetry GenAI spans (JSONL): each LLM-call span a request, sent when the LLM "
        "spans before it in its trace ended plus the recorded gap"
    )
    options: type[BaseModel] = AgentTraceOptions
    timed = True
    conversation = True

    def check(self, params: WorkloadParams, options: BaseModel) -> None:
        if not params.dataset_path:
            raise ValueError(f"dataset_path is required when dataset is {self.name!r}")
        if params.warmup_requests:
            raise ValueError(NO_WARMUPS)

    def prompt_tokens(self, params: WorkloadParams, options: BaseModel) -> int | None:
        return None

    def build(self, params: WorkloadParams, options: BaseModel, ctx: BuildContext) -> Workload:
        assert isinstance(options, AgentTraceOptions) and params.dataset_path is not None
        digest = FileDigest()
        spans: list[_Span] = []
        lines = open_dataset(params.dataset_path, ctx.dataset_dirs, digest.update)
        for lineno, line in enumerate(lines, 1):
            check_cancel(ctx.cancelled, lineno)
            if line.strip():
                spans.append(_Span(json_object_line(line, lineno, " (a span)"), lineno))
        nodes = spans_to_nodes(spans, params.output_len)
        if not nodes:
            raise ValueError(
                "dataset_path: no LLM span (attributes.gen_ai.operation.name chat, "
                "text_completion or generate_content) in the file"
            )
        trace = graph_of(nodes, options.speedup, params.num_prompts)
        return trace_workload(trace, ctx.tokenizer, digest.source(), options.speedup)


OTEL = OtelDataset()
