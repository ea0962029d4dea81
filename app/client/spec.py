"""What a run asks for: ``RunSpec``, everything needed to repeat a benchmark run (flag
names follow ``vllm bench serve``). Its workload fields are the dataset type's
(``app.client.datasets``): ``dataset`` names the type, ``dataset_options`` holds its own
fields, checked by the type. Likewise its API surface (``app.client.endpoints``):
``endpoint`` names it, ``endpoint_options`` holds its own fields.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.analysis.metric_defs import slo_metrics
from app.client.datasets import (
    DATASET_HELP,
    DATASET_OPTIONS_HELP,
    dataset_type,
    parse_options,
)
from app.client.datasets.base import MAX_NUM_PROMPTS, MAX_PROMPT_TOKENS, WorkloadParams
from app.client.endpoints import (
    ENDPOINT_HELP,
    ENDPOINT_OPTIONS_HELP,
    ENDPOINTS,
    endpoint_type,
    parse_endpoint_options,
)
from app.client.endpoints.base import BodyParams, EndpointType, SpecFacts
from app.client.limits import ClientLimits
from app.client.routing import (
    DEFAULT_SESSION_HEADER,
    ModelShare,
    Routing,
    check_base_urls,
    check_mix,
    split_several,
)
from app.client.url_checks import check_api_key, checked_url
from app.domain import MAX_JSON_DEPTH, json_depth

SLOMetric = str  # an SLO name of the metric registry (``metric_defs.slo_metrics``)
Arrival = Literal["poisson", "gamma", "constant"]
TokenCounting = Literal["auto", "usage", "tokenizer"]
ConnectionMode = Literal["keep-alive", "new"]
RampUp = Literal["linear", "exponential"]
# sampling parameters a run may set, merged into every request's body (vLLM's names)
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
)
# header names refused in ``headers``: the client sets these itself
RESERVED_HEADERS = frozenset(
    {"host", "content-length", "content-type", "transfer-encoding", "connection", "x-request-id"}
)
# a header whose name contains one of these is a secret: refused (give api_key or
# api_key_env, which are never stored), so a stored spec never holds one in plaintext
SECRET_HEADER_WORDS = ("authorization", "api-key", "apikey", "api_key", "token", "secret",
                       "cookie", "password", "auth")  # fmt: skip
MAX_HEADERS = 64
MAX_PROCESSES = 1024
MAX_SHARDS = 256
# one request may stream for a day at most; a run lasts 30 days at most (its deadline in ns
# must stay a finite integer)
MAX_REQUEST_TIMEOUT_S = 86_400.0
MAX_RUN_DURATION_S = 30 * 86_400.0
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
# the goodput SLOs of a surface that generates no tokens (one answer: its latency only)
ANSWER_SLOS = frozenset({"e2el"})

DEFAULT_NUM_PROMPTS = 100  # a dataset type that is not timed; a trace: its every line
TARGETS_SUFFIX = "_TARGETS"  # TOKENTRACE_TARGET_KEY_<NAME>_TARGETS: where <NAME> may go


class RunSpec(BaseModel):
    """Everything needed to repeat a benchmark run (flag names follow `vllm bench serve`)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(description="Target server, e.g. http://127.0.0.1:8000")
    model: str = Field(min_length=1, max_length=255)  # runs.model is VARCHAR(255)
    endpoint: str = Field(
        "chat", description=ENDPOINT_HELP, json_schema_extra={"enum": list(ENDPOINTS)}
    )
    endpoint_options: dict[str, Any] = Field(
        default_factory=dict,
        description=ENDPOINT_OPTIONS_HELP,
    )
    # workload
    dataset: str = Field("random", description=DATASET_HELP)
    dataset_path: str | None = None
    dataset_options: dict[str, Any] = Field(
        default_factory=dict,
        description=DATASET_OPTIONS_HELP,
    )
    input_len: int = Field(256, ge=1, le=1_000_000)
    output_len: int = Field(128, ge=1, le=1_000_000)
    num_prompts: int | None = Field(
        None,
        ge=1,
        le=MAX_NUM_PROMPTS,
        description=f"requests (sessions when multi_turn); not given: {DEFAULT_NUM_PROMPTS}, "
        "or a trace's every line (mooncake, timed_jsonl)",
    )
    seed: int = 0
    tokenizer: str | None = Field(None, description="local path of a Hugging Face tokenizer")
    ignore_eos: bool = True
    # multi-turn sessions (docs/workloads.md): num_prompts counts sessions, max_concurrency
    # active sessions; each turn is sent after the previous reply ended + turn_delay_ms
    multi_turn: bool = Field(False, description="replay conversations as multi-turn sessions")
    max_turns: int | None = Field(None, ge=1, le=10_000, description="turns per session, at most")
    turn_delay_ms: float = Field(0.0, ge=0, le=3_600_000, description="think time between turns")
    token_counting: TokenCounting = "auto"
    # load shape
    request_rate: float = Field(math.inf, gt=0, description="req/s; inf sends all at once")
    arrival: Arrival = "poisson"
    burstiness: float = Field(1.0, gt=0, description="gamma shape; 1.0 = Poisson")
    max_concurrency: int | None = Field(None, ge=1)
    # vLLM's ramp-up: the rate of request i is start + (end - start) * i/(N-1) (linear) or
    # start * (end/start)^(i/(N-1)) (exponential), the gap before it drawn at that rate
    ramp_up_strategy: RampUp | None = Field(None, description="linear | exponential")
    ramp_up_start_rps: float | None = Field(None, gt=0, le=1_000_000)
    ramp_up_end_rps: float | None = Field(None, gt=0, le=1_000_000)
    warmup_requests: int = Field(0, ge=0, le=100_000)
    # load processes on this host (app.client.shards): one schedule dealt to them, one run
    processes: int | Literal["auto"] = Field(
        1,
        description="load processes on this host: a count (1 to 1024) or auto (the cores "
        "this machine can spare: its usable cores less one, at least 1)",
    )
    # workers (docs/scale.md): one schedule dealt over K leases started at one instant
    shards: int = Field(
        1, description=f"workers one run is dealt over, each a lease (1 to {MAX_SHARDS})"
    )
    request_timeout_s: float = Field(
        600.0, gt=0, le=MAX_REQUEST_TIMEOUT_S, description="one request's limit, s (<= 1 day)"
    )
    # connections (SPEC 1b): kept open across requests (one per concurrency slot), or a new
    # one per request (connection setup then shows in the user-perceived TTFT, not in TTFT)
    connection_mode: ConnectionMode = "keep-alive"
    max_duration_s: float | None = Field(
        None, gt=0, le=MAX_RUN_DURATION_S, description="the whole run's limit, s (<= 30 days)"
    )
    # SLOs for goodput, in ms, e.g. {"ttft": 150, "e2el": 2000}
    goodput: dict[SLOMetric, float] = Field(default_factory=dict)
    # client-limited bound: send lag / event-loop lag p99 above this marks the run
    client_lag_bound_ms: float = Field(10.0, gt=0)
    # error bound: a run whose error rate (failed / sent) exceeds it ends "partial"
    max_error_rate: float = Field(
        0.05, ge=0, le=1, description="a run whose error rate exceeds this ends partial"
    )
    # reproduction metadata supplied by the user
    engine: str | None = None
    engine_version: str | None = None
    dtype: str | None = None
    engine_flags: str | None = None
    extra_body: dict[str, object] = Field(default_factory=dict)
    # sampling parameters, merged into every request's body when set
    temperature: float | None = Field(None, ge=0, le=100)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1, le=1_000_000, description="-1: off (vLLM)")
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0, le=100)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    # request shaping
    stream: bool = Field(
        True, description="false: one JSON response per request (TTFT = E2E, no ITL)"
    )
    headers: dict[str, str] = Field(
        default_factory=dict,
        description="extra HTTP headers sent on every request; names that look like a "
        "secret (authorization, api-key, token, secret, cookie, ...) are refused: give "
        "api_key or api_key_env",
    )
    api_key: str | None = Field(None, exclude=True)
    # the key's name in the environment of the machine that runs the load (a worker): the
    # key then never reaches the dashboard. Only names in this namespace, so a run cannot
    # make a worker send one of its other secrets (its own token) to a target; and only to
    # the targets its binding, <NAME>_TARGETS there, lists (app.client.target_keys).
    api_key_env: str | None = Field(
        None,
        pattern=r"^TOKENTRACE_TARGET_KEY_[A-Z0-9_]{1,64}$",
        description="environment variable holding the target's API key, "
        "TOKENTRACE_TARGET_KEY_<NAME>, read where the load runs; it is sent only to the "
        "targets listed in TOKENTRACE_TARGET_KEY_<NAME>_TARGETS there",
    )
    tags: list[str] = Field(default_factory=list)
    # server metrics: scrape the target's Prometheus /metrics about once a second
    scrape_metrics: bool = True
    metrics_url: str | None = Field(None, description="default: base_url + /metrics")
    metrics_series: list[str] = Field(default_factory=list, description="extra series names")
    # server controls around the measured window (app.client.server_controls)
    reset_prefix_cache: bool = Field(
        False,
        description="empty the server's prefix cache (each target's) after the warm-ups, "
        "before the first measured request (vLLM POST /reset_prefix_cache, SGLang POST "
        "/flush_cache)",
    )
    server_profile: bool = Field(
        False,
        description="run the server's profiler (each target's) over the measured window "
        "(POST /start_profile and /stop_profile); the trace's path is kept when it says it",
    )
    # how much of the target's answers the client may hold (app.client.limits)
    limits: ClientLimits = Field(default_factory=ClientLimits)
    # several models and targets (app.client.routing; docs/workloads.md)
    model_mix: list[ModelShare] = Field(
        default_factory=list,
        description="a weighted mix of models (LoRA adapters are model names): each request, "
        "or session, draws its model with the run's seed; model is then one of them "
        "(model 'a:0.7,b:0.3' is the same mix written as text)",
    )
    base_urls: list[str] = Field(
        default_factory=list,
        description="several targets (base_url is then one of them; base_url "
        "'http://a:8000,http://b:8000' is the same); each request goes to one by routing",
    )
    routing: Routing = Field(
        "round-robin",
        description="round-robin: by request index (a session stays on one target); session: "
        "a stable hash of the session picks its target and session_header names it",
    )
    session_header: str = Field(
        DEFAULT_SESSION_HEADER, description="the header naming the session (routing session)"
    )

    @model_validator(mode="before")
    @classmethod
    def _several_as_text(cls, data: Any) -> Any:
        return split_several(data)

    @field_validator("base_urls")
    @classmethod
    def _base_urls(cls, v: list[str]) -> list[str]:
        return check_base_urls([checked_url("base_urls", u).rstrip("/") for u in v])

    @field_validator("model_mix")
    @classmethod
    def _model_mix(cls, v: list[ModelShare]) -> list[ModelShare]:
        return check_mix(v)

    @field_validator("session_header")
    @classmethod
    def _session_header(cls, v: str) -> str:
        if not _HEADER_NAME.match(v) or v.lower() in RESERVED_HEADERS:
            raise ValueError(f"session_header: {v[:60]!r} is not a header name the run may set")
        return v

    @model_validator(mode="after")
    def _several(self) -> RunSpec:
        """A mix of one model is that model; a list of one target is ``base_url``."""
        if len(self.model_mix) == 1:
            self.model, self.model_mix = self.model_mix[0].model, []
        if self.model_mix and self.model not in {s.model for s in self.model_mix}:
            raise ValueError("model: with a model_mix, model must be one of its models")
        if len(self.base_urls) == 1:
            self.base_url, self.base_urls = self.base_urls[0], []
        if self.base_urls and self.base_url not in self.base_urls:
            raise ValueError("base_url: with base_urls, base_url must be one of them")
        if self.session_header.lower() in {h.lower() for h in self.headers}:
            raise ValueError(f"session_header: {self.session_header} is also in headers")
        if self.base_urls and self.metrics_url:
            raise ValueError(
                f"metrics_url: names one target's /metrics; base_urls names "
                f"{len(self.base_urls)}, and each one's /metrics is scraped at its base URL "
                "+ /metrics (leave metrics_url out)"
            )
        return self

    def targets(self) -> list[str]:
        """The run's base URLs, in order (one: ``base_url``)."""
        return list(self.base_urls) or [self.base_url]

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        return checked_url("base_url", v).rstrip("/")

    @field_validator("processes", mode="before")
    @classmethod
    def _processes(cls, v: object) -> object:
        if v == "auto":
            return v
        if isinstance(v, bool) or not isinstance(v, int | str):
            raise ValueError("processes: a whole number from 1 to 1024, or auto")
        try:
            n = int(v)
        except ValueError:
            raise ValueError("processes: a whole number from 1 to 1024, or auto") from None
        if not 1 <= n <= MAX_PROCESSES:
            raise ValueError(f"processes: from 1 to {MAX_PROCESSES} (or auto), not {n}")
        return n

    @field_validator("shards", mode="before")
    @classmethod
    def _shards(cls, v: object) -> object:
        why = f"shards: a whole number from 1 to {MAX_SHARDS}"
        if isinstance(v, bool) or not isinstance(v, int | str):
            raise ValueError(why)
        try:
            n = int(v)
        except ValueError:
            raise ValueError(why) from None
        if not 1 <= n <= MAX_SHARDS:
            raise ValueError(f"{why}, not {n}")
        return n

    @field_validator("metrics_url")
    @classmethod
    def _metrics_url_text(cls, v: str | None) -> str | None:
        return None if v is None else checked_url("metrics_url", v)

    @field_validator("api_key")
    @classmethod
    def _api_key(cls, v: str | None) -> str | None:
        if v is not None:
            check_api_key("api_key", v)
        return v

    @field_validator("api_key_env")
    @classmethod
    def _api_key_env(cls, v: str | None) -> str | None:
        if v is not None and v.endswith(TARGETS_SUFFIX):
            raise ValueError(
                f"api_key_env: {v} names a key's binding (the targets it may be sent to), not a key"
            )
        return v

    @model_validator(mode="after")
    def _num_prompts(self) -> RunSpec:
        """Not given: the default count, except for a trace (a timed type), which then
        replays every line (how many is known once its file is read)."""
        if self.num_prompts is None and not dataset_type(self.dataset).timed:
            self.num_prompts = DEFAULT_NUM_PROMPTS
        return self

    @model_validator(mode="after")
    def _controls_one_process(self) -> RunSpec:
        """The server controls wrap one measured window; a run dealt over load processes
        has one per process, so they are refused together rather than run N times."""
        if self.processes != 1 and (self.reset_prefix_cache or self.server_profile):
            which = "reset_prefix_cache" if self.reset_prefix_cache else "server_profile"
            raise ValueError(
                f"{which}: runs in one load process only (processes is {self.processes})"
            )
        if self.shards != 1 and (self.reset_prefix_cache or self.server_profile):
            which = "reset_prefix_cache" if self.reset_prefix_cache else "server_profile"
            raise ValueError(f"{which}: runs on one worker only (shards is {self.shards})")
        least = min(self.num_prompts or self.shards, self.max_concurrency or self.shards)
        if self.shards > least:  # a shard with no share would hold the others' start
            raise ValueError(
                f"shards: {self.shards} is more than the run's requests or concurrency "
                f"({least}): every shard needs a share"
            )
        return self

    @model_validator(mode="after")
    def _agent_one_process(self) -> RunSpec:
        """An agent trace's requests wait on one another: one load process drives them."""
        if self.processes != 1 and getattr(dataset_type(self.dataset), "conversation", False):
            raise ValueError(
                f"processes: the dataset {self.dataset!r} is replayed by one load process "
                f"(processes is {self.processes})"
            )
        if self.shards != 1 and getattr(dataset_type(self.dataset), "conversation", False):
            raise ValueError(
                f"shards: the dataset {self.dataset!r} is replayed by one load process "
                f"(shards is {self.shards})"
            )
        return self

    @model_validator(mode="after")
    def _metrics_url(self) -> RunSpec:
        if self.metrics_url is None:
            return self
        url, base = urlsplit(self.metrics_url), urlsplit(self.base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError("metrics_url must be an http:// or https:// URL")
        if url.hostname != base.hostname:
            raise ValueError("metrics_url must be on the same host as base_url")
        return self

    @field_validator("goodput")
    @classmethod
    def _slos(cls, v: dict[SLOMetric, float]) -> dict[SLOMetric, float]:
        known = slo_metrics()
        for k, ms in v.items():
            if k not in known:
                raise ValueError(
                    f"goodput: unknown SLO {k[:40]!r}; expected one of {', '.join(known)}"
                )
            if not (ms > 0 and math.isfinite(ms)):
                raise ValueError(f"goodput SLO {k} must be a positive number of ms")
        return v

    @field_validator("extra_body")
    @classmethod
    def _extra_body(cls, v: dict[str, object]) -> dict[str, object]:
        if json_depth(v) > MAX_JSON_DEPTH:
            raise ValueError(f"extra_body is nested deeper than {MAX_JSON_DEPTH} levels")
        return v

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_HEADERS:
            raise ValueError(f"headers: at most {MAX_HEADERS} headers")
        seen: set[str] = set()
        for name, value in v.items():
            low = name.lower()
            if not _HEADER_NAME.match(name):
                raise ValueError(f"headers: {name!r} is not a valid header name")
            if low in seen:
                raise ValueError(f"headers: {name!r} is given twice")
            seen.add(low)
            if low in RESERVED_HEADERS:
                raise ValueError(f"headers: {name} is set by the client itself")
            if any(w in low for w in SECRET_HEADER_WORDS):
                raise ValueError(
                    f"headers: {name} looks like a secret; headers are stored with the run, "
                    "so give the key as api_key or api_key_env (never stored)"
                )
            if len(value) > 8192 or not all(c == "\t" or " " <= c <= "~" for c in value):
                raise ValueError(
                    f"headers: {name}'s value must be one line of printable ASCII, at most "
                    "8192 characters"
                )
        return v

    @model_validator(mode="after")
    def _sampling(self) -> RunSpec:
        for name in SAMPLING_FIELDS:
            if getattr(self, name) is not None and name in self.extra_body:
                raise ValueError(f"{name}: given both as a field and in extra_body")
        return self

    @model_validator(mode="after")
    def _load_shape(self) -> RunSpec:
        ramp = (self.ramp_up_strategy, self.ramp_up_start_rps, self.ramp_up_end_rps)
        if any(x is not None for x in ramp) and any(x is None for x in ramp):
            raise ValueError(
                "ramp_up_strategy: a ramp-up needs ramp_up_strategy, ramp_up_start_rps and "
                "ramp_up_end_rps"
            )
        if self.ramp_up_strategy is not None and not math.isinf(self.request_rate):
            raise ValueError("request_rate: give request_rate or a ramp-up, not both")
        if dataset_type(self.dataset).timed:
            given = [
                name
                for name, differs in (
                    ("request_rate", not math.isinf(self.request_rate)),
                    ("arrival", self.arrival != "poisson"),
                    ("burstiness", self.burstiness != 1.0),
                    ("ramp_up_strategy", self.ramp_up_strategy is not None),
                )
                if differs
            ]
            if given:
                raise ValueError(
                    f"{given[0]}: the dataset {self.dataset!r} gives each request's send "
                    "time; a load shape does not apply"
                )
        return self

    @model_validator(mode="after")
    def _one_key(self) -> RunSpec:
        if self.api_key and self.api_key_env:
            raise ValueError("api_key_env: give api_key or api_key_env, not both")
        return self

    @field_validator("dataset")
    @classmethod
    def _dataset_name(cls, v: str) -> str:
        dataset_type(v)  # a ValueError names the known types
        return v

    @field_validator("dataset_options")
    @classmethod
    def _dataset_options_depth(cls, v: dict[str, Any]) -> dict[str, Any]:
        if json_depth(v) > MAX_JSON_DEPTH:
            raise ValueError(f"dataset_options is nested deeper than {MAX_JSON_DEPTH} levels")
        return v

    @field_validator("endpoint")
    @classmethod
    def _endpoint_name(cls, v: str) -> str:
        endpoint_type(v)  # a ValueError names the known surfaces
        return v

    @field_validator("endpoint_options")
    @classmethod
    def _endpoint_options_depth(cls, v: dict[str, Any]) -> dict[str, Any]:
        if json_depth(v) > MAX_JSON_DEPTH:
            raise ValueError(f"endpoint_options is nested deeper than {MAX_JSON_DEPTH} levels")
        return v

    @model_validator(mode="after")
    def _endpoint(self) -> RunSpec:
        """The surface's own options and checks, and what does not apply to it: a stream
        (one answer: ``stream`` is stored false), sampling and the token SLOs (no tokens
        generated), a conversation."""
        kind, options = self.surface()
        name = self.endpoint
        if self.multi_turn and not kind.conversation:
            takes = " or ".join(repr(k) for k, e in ENDPOINTS.items() if e.conversation)
            raise ValueError(
                f"endpoint: multi_turn sessions send the chat history; endpoint {name!r} "
                f"takes no conversation: endpoint must be {takes}"
            )
        if getattr(dataset_type(self.dataset), "conversation", False) and not kind.conversation:
            takes = " or ".join(repr(k) for k, e in ENDPOINTS.items() if e.conversation)
            raise ValueError(
                f"endpoint: the dataset {self.dataset!r} sends chat histories; endpoint "
                f"{name!r} takes no conversation: endpoint must be {takes}"
            )
        if getattr(dataset_type(self.dataset), "images", False) and not kind.parts:
            takes = " or ".join(repr(k) for k, e in ENDPOINTS.items() if e.parts)
            raise ValueError(
                f"dataset: {self.dataset!r} sends images in chat messages; endpoint {name!r} "
                f"sends no images: endpoint must be {takes}"
            )
        if not kind.generates:
            for field in SAMPLING_FIELDS:
                if getattr(self, field) is not None:
                    raise ValueError(
                        f"{field}: endpoint {name!r} generates no tokens: sampling does not apply"
                    )
            slos = sorted(set(self.goodput) - ANSWER_SLOS)
            if slos:
                raise ValueError(
                    f"goodput: endpoint {name!r} answers once, with no tokens: only the "
                    f"e2el SLO applies ({slos[0]} given)"
                )
        if not kind.streams:
            self.stream = False
        facts = SpecFacts(
            self.dataset, dataset_type(self.dataset).timed, self.multi_turn, self.output_len
        )
        kind.check(facts, options)
        # stored less the surface's defaults, as dataset_options
        self.endpoint_options = options.model_dump(exclude_defaults=True)
        return self

    @model_validator(mode="after")
    def _workload(self) -> RunSpec:
        """The dataset type's own checks, then the client's budget for prompts built in
        memory before the run."""
        kind = dataset_type(self.dataset)
        params = self.workload_params()
        options = parse_options(kind, self.dataset_options)
        kind.check(params, options)
        # stored as given, less the type's defaults: an option left at its default and an
        # option not given are the same workload (comparisons read this dict)
        self.dataset_options = options.model_dump(exclude_defaults=True)
        total = kind.prompt_tokens(params, options)
        if total is not None and total > MAX_PROMPT_TOKENS:
            raise ValueError(
                f"num_prompts: (num_prompts + warmup_requests) x input_len = {total:,} prompt "
                f"tokens, over the client's budget of {MAX_PROMPT_TOKENS:,}"
            )
        return self

    def sampling_body(self) -> dict[str, object]:
        """The sampling parameters that are set, then ``extra_body``: merged into each body."""
        out: dict[str, object] = {
            k: getattr(self, k) for k in SAMPLING_FIELDS if getattr(self, k) is not None
        }
        return out | dict(self.extra_body)

    @model_validator(mode="after")
    def _sessions(self) -> RunSpec:
        if not self.multi_turn:
            if self.max_turns is not None or self.turn_delay_ms:
                raise ValueError("multi_turn: max_turns and turn_delay_ms need multi_turn")
            return self
        if self.dataset not in ("sharegpt", "jsonl"):
            raise ValueError(
                f"dataset: multi_turn replays conversations: dataset must be 'sharegpt' or "
                f"'jsonl', not {self.dataset!r}"
            )
        return self

    @property
    def prompts(self) -> int:
        """``num_prompts`` once known: a trace given none gets its line count when its
        workload is built (``run_load``)."""
        if self.num_prompts is None:
            raise ValueError("num_prompts: a trace's request count is known once it is read")
        return self.num_prompts

    def surface(self) -> tuple[EndpointType, BaseModel]:
        """The run's API surface and its options (checked)."""
        kind = endpoint_type(self.endpoint)
        return kind, parse_endpoint_options(kind, self.endpoint_options)

    def body_params(self) -> BodyParams:
        """What every request body reads of the run (its prompt apart)."""
        return BodyParams(self.model, self.ignore_eos, self.stream, self.sampling_body())

    def workload_params(self) -> WorkloadParams:
        """The dataset's fields: its prompts are the requests' times the prompts one request
        carries (an embeddings batch)."""
        kind, options = self.surface()
        batch = kind.batch(options)
        return WorkloadParams(
            num_prompts=None if self.num_prompts is None else self.num_prompts * batch,
            warmup_requests=self.warmup_requests * batch,
            input_len=self.input_len,
            output_len=self.output_len,
            seed=self.seed,
            dataset_path=self.dataset_path,
        )
