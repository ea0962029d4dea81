"""Dataset type ``agentic``: an agent trace, sessions whose requests wait on earlier ones
(a DAG per session: ``agent_graph``), replayed by ``app.client.agent_sessions``.

One request per line (JSONL)::

    {"session_id": "s1", "request_id": "plan", "parent_ids": [], "delay_ms": 0,
     "timestamp_ms": 0, "messages": [{"role": "user", "content": "..."}], "output_len": 64}
    {"session_id": "s1", "request_id": "read", "parent_ids": ["plan"], "delay_ms": 120,
     "include_parent_reply": true, "tool_results": [{"tool_call_id": "c1",
     "name": "read_file", "content": "..."}], "prompt": "go on", "output_len": 32}

* ``session_id``, ``request_id`` (strings or integers): required; a request id is unique
  within its session.
* ``parent_ids``: the requests of the same session it waits for (default none: a root).
* ``delay_ms`` (>= 0, default 0), or WEKA's ``think_time`` in seconds: the recorded gap
  between the last parent's end (a root: the session's start) and this request.
* ``messages`` (chat messages) or ``prompt`` (one user message): required, its own input.
* ``output_len`` (or WEKA's ``out``): max_tokens asked; default the run's ``output_len``.
* ``include_parent_reply`` (default false): continue the first parent's conversation (its
  messages and the reply the server actually streamed); ``tool_results`` (list of
  ``{"content", "tool_call_id"?, "name"?}``) then follow that reply as ``tool`` messages.
  ``{{reply:<request_id>}}`` in a message's text is replaced by that parent's reply.
* ``timestamp_ms``: the session's start (ms from the trace's start) on its first line;
  sessions start in file order, their start times never decreasing (default: the previous
  session's start, 0 for the first). Divided by ``speedup`` (``--trace-speedup``), as the
  delays are.

``num_prompts`` counts sessions (the first N in file order; not given: all). Warm-ups are
refused (a warm-up would send a measured session's prompt first). The run records the
file's sha256. The WEKA agentic trace format is read as it is by ``weka``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from app.client.datasets.agent_graph import AgentTrace, RawNode, ToolResult, graph_of
from app.client.datasets.base import (
    AnyTokenizer,
    BuildContext,
    FileDigest,
    Prompt,
    Workload,
    WorkloadParams,
    check_cancel,
    json_object_line,
    open_dataset,
)
from app.client.datasets.jsonl import parse_prompt_line

NO_WARMUPS = (
    "warmup_requests: an agent trace has no warm-ups (a warm-up would send a measured "
    "session's prompt first): give 0"
)


class AgentTraceOptions(BaseModel):
    model_config = {"extra": "forbid"}

    speedup: float = Field(
        1.0, gt=0, le=1_000_000, description="divide the trace's delays and start times by this"
    )


def _id(obj: dict[str, Any], key: str, where: str) -> str:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, str | int) or v == "":
        raise ValueError(f"{where}: '{key}' is required: a non-empty string or an integer")
    return str(v)


def _number(obj: dict[str, Any], key: str, where: str) -> float | None:
    v = obj.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or v != v:
        raise ValueError(f"{where}: '{key}' must be a number")
    return float(v)


def _tool_results(obj: dict[str, Any], where: str, rid: str) -> tuple[ToolResult, ...]:
    raw = obj.get("tool_results")
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError(f"{where}: 'tool_results' must be a list")
    out: list[ToolResult] = []
    for k, t in enumerate(raw):
        if not isinstance(t, dict) or not isinstance(t.get("content"), str):
            raise ValueError(f"{where}: 'tool_results' item {k + 1} needs a string 'content'")
        call_id = t.get("tool_call_id", f"call_{rid}_{k}")
        name = t.get("name", "tool")
        if not isinstance(call_id, str) or not isinstance(name, str):
            raise ValueError(
                f"{where}: 'tool_results' item {k + 1}: 'tool_call_id' and 'name' are strings"
            )
        out.append(ToolResult(call_id, name, t["content"]))
    return tuple(out)


def raw_node(obj: dict[str, Any], lineno: int, tok: AnyTokenizer, default_out: int) -> RawNode:
    """Line ``lineno``'s request, its fields checked (the graph's checks come after)."""
    where = f"dataset_path line {lineno}"
    session = _id(obj, "session_id", where)
    rid = _id(obj, "request_id", where)
    parents = obj.get("parent_ids", [])
    if not isinstance(parents, list):
        raise ValueError(f"{where}: 'parent_ids' must be a list of request ids")
    pids = tuple(_id({"parent_ids": p}, "parent_ids", where) for p in parents)
    delay = _number(obj, "delay_ms", where)
    think = _number(obj, "think_time", where)
    if delay is not None and think is not None:
        raise ValueError(f"{where}: 'delay_ms': give delay_ms or think_time (s), not both")
    delay_ms = delay if delay is not None else (think * 1000.0 if think is not None else 0.0)
    if "messages" not in obj and "prompt" not in obj:
        raise ValueError(f"{where}: 'messages' or 'prompt' is required")
    if "out" in obj and "output_len" not in obj:
        obj = {**obj, "output_len": obj["out"]}
    prompt = parse_prompt_line(obj, where, tok, default_out)
    messages = prompt.messages or [{"role": "user", "content": prompt.prompt}]
    carry = obj.get("include_parent_reply", False)
    if not isinstance(carry, bool):
        raise ValueError(f"{where}: 'include_parent_reply' must be true or false")
    return RawNode(
        lineno=lineno,
        session_id=session,
        request_id=rid,
        parent_ids=pids,
        delay_ms=delay_ms,
        messages=tuple(messages),
        output_len=prompt.output_len,
        tool_results=_tool_results(obj, where, rid),
        carry_reply=carry,
        timestamp_ms=_number(obj, "timestamp_ms", where),
    )


def own_prompts(trace: AgentTrace, tok: AnyTokenizer) -> list[Prompt]:
    """Each request's own messages as a prompt (what it sends besides what it carries)."""
    out: list[Prompt] = []
    for n in trace.nodes:
        tokens = sum(
            tok.count(m["content"]) for m in n.messages if isinstance(m.get("content"), str)
        )
        out.append(Prompt(None, list(n.messages), tokens, n.output_len))
    return out


def trace_workload(
    trace: AgentTrace, tok: AnyTokenizer, source: str | None, speedup: float
) -> Workload:
    depth = max(n.depth for n in trace.nodes)
    stats: dict[str, object] = {
        "kind": "agent_trace",
        "speedup": speedup,
        "sessions": trace.sessions,
        "requests": len(trace.nodes),
        "max_depth": depth,
    }
    prompts = own_prompts(trace, tok)
    return Workload([], prompts, source, at_ns=[0] * len(prompts), stats=stats, agent=trace)


class AgenticDataset:
    name = "agentic"
    summary = (
        "an agent trace (JSONL: session_id, request_id, parent_ids, delay_ms, messages or "
        "prompt): each request sent when its parents ended plus its delay"
    )
    options: type[BaseModel] = AgentTraceOptions
    timed = True
    conversation = True  # it sends chat histories: a conversation surface only

    def check(self, params: WorkloadParams, options: BaseModel) -> None:
        if not params.dataset_path:
            raise ValueError(f"dataset_path is required when dataset is {self.name!r}")
        if params.warmup_requests:
            raise ValueError(NO_WARMUPS)

    def prompt_tokens(self, params: WorkloadParams, options: BaseModel) -> int | None:
        return None  # bounded by the file's size (MAX_DATASET_BYTES)

    def build(self, params: WorkloadParams, options: BaseModel, ctx: BuildContext) -> Workload:
        assert isinstance(options, AgentTraceOptions) and params.dataset_path is not None
        digest = FileDigest()
        raw: list[RawNode] = []
        lines = open_dataset(params.dataset_path, ctx.dataset_dirs, digest.update)
        for lineno, line in enumerate(lines, 1):
            check_cancel(ctx.cancelled, lineno)
            if not line.strip():
                continue
            obj = json_object_line(line, lineno, " with 'session_id' and 'request_id'")
            raw.append(raw_node(obj, lineno, ctx.tokenizer, params.output_len))
        trace = graph_of(raw, options.speedup, params.num_prompts)
        return trace_workload(trace, ctx.tokenizer, digest.source(), options.speedup)


AGENTIC = AgenticDataset()
