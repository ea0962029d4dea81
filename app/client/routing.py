"""A run's model mix and its targets: which model and which base URL each request uses.

A run names one model (``RunSpec.model``) or a weighted mix (``RunSpec.model_mix``; a LoRA
adapter is just a model name), and one target (``base_url``) or several (``base_urls``).
``Router`` assigns each request, or each session (multi-turn, agent trace: one model and one
target for the session's life), a ``Route``, deterministically:

* the model: a draw from the mix, ``u = blake2b(seed, key)`` as a number in [0, 1), the
  first model whose cumulative weight share exceeds ``u``; the same seed gives the same
  assignment, and it depends on the request's global index (a session's number) alone, so
  a run dealt over load processes (``app.client.shards``) draws what one process would;
* the target: ``round-robin`` by request index (a session's number), or ``session``
  (affinity): a stable hash of the session's number picks its target, and the header
  ``session_header`` (default ``X-Session-ID``) names the session on each of its requests
  (a single request is its own session).

A run of one model and one target routes nothing: its records keep ``model`` and
``target`` None (stored as before).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Routing = Literal["round-robin", "session"]
ROUTINGS: tuple[str, ...] = ("round-robin", "session")
MAX_MODELS = 64
MAX_TARGETS = 64
DEFAULT_SESSION_HEADER = "X-Session-ID"
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


class ModelShare(BaseModel):
    """One model of a mix and its weight (any positive number: shares are weight / sum)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=255)
    weight: float = Field(1.0, description="a positive number; the share is weight / sum")


def parse_mix_text(field: str, text: str) -> list[ModelShare]:
    """``name:weight,name:weight,...`` (the CLI's ``--model``, the form's model field): a
    ValueError naming ``field`` for an empty name or a weight that is not a number. The
    weight is what follows the last colon (a name may hold colons: ``llama3:8b:0.5``)."""
    out: list[ModelShare] = []
    for i, part in enumerate(text.split(",")):
        item = part.strip()
        name, sep, weight = item.rpartition(":")
        if not sep or not _NUMBER.match(weight.strip()):
            raise ValueError(
                f"{field}: item {i + 1} ({item[:60]!r}) of a model mix must be name:weight, "
                "the weight a positive number"
            )
        if not name.strip():
            raise ValueError(f"{field}: item {i + 1} of the model mix has an empty model name")
        out.append(ModelShare(model=name.strip(), weight=float(weight)))
    return out


def check_mix(mix: list[ModelShare]) -> list[ModelShare]:
    """The mix as given; a ValueError naming ``model_mix`` for a weight that is not a
    positive finite number, a model given twice or more than ``MAX_MODELS`` models."""
    if len(mix) > MAX_MODELS:
        raise ValueError(f"model_mix: at most {MAX_MODELS} models, not {len(mix)}")
    seen: set[str] = set()
    for share in mix:
        if not (math.isfinite(share.weight) and share.weight > 0):
            raise ValueError(
                f"model_mix: the weight of {share.model[:60]!r} must be a positive number, "
                f"not {share.weight:g}"
            )
        if share.model in seen:
            raise ValueError(f"model_mix: {share.model[:60]!r} is given twice")
        seen.add(share.model)
    if not math.isfinite(sum(s.weight for s in mix)):
        raise ValueError("model_mix: the weights' sum must be a finite positive number")
    return mix


def check_base_urls(urls: list[str]) -> list[str]:
    """The URLs as given; a ValueError naming ``base_urls`` for a repeated one or more than
    ``MAX_TARGETS``."""
    if len(urls) > MAX_TARGETS:
        raise ValueError(f"base_urls: at most {MAX_TARGETS} targets, not {len(urls)}")
    seen: set[str] = set()
    for url in urls:
        if url.lower() in seen:
            raise ValueError(f"base_urls: {url} is given twice")
        seen.add(url.lower())
    return urls


def mix_label(mix: list[ModelShare]) -> str:
    """The mix as ``name:weight,...`` (the CLI's form of it)."""
    return ",".join(f"{s.model}:{s.weight:g}" for s in mix)


def unit(seed: int, kind: str, key: int) -> float:
    """A number in [0, 1) fixed by (seed, kind, key): blake2b's first 8 bytes / 2**64."""
    h = hashlib.blake2b(f"{seed}/{kind}/{key}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2.0**64


@dataclass(frozen=True, slots=True)
class Route:
    """Where one request goes: its target's index (``lane``) and model's index, and the
    names its record keeps (None: the run has one model / one target); ``session``: the
    value of the session header (session routing), else None."""

    lane: int = 0
    model_idx: int = 0
    model: str | None = None
    target: str | None = None
    session: str | None = None


NO_ROUTE = Route()  # a run of one model and one target


class Router:
    """The routes of one run (``routing`` module docstring)."""

    def __init__(
        self,
        models: list[str],
        weights: list[float],
        targets: list[str],
        *,
        routing: Routing = "round-robin",
        seed: int = 0,
        run_tag: str = "run",
    ) -> None:
        self.models = models
        total = sum(weights)
        acc, cum = 0.0, []
        for w in weights:
            acc += w
            cum.append(acc / total)
        cum[-1] = 1.0
        self.cum = cum
        self.targets = targets
        self.routing = routing
        self.seed = seed
        self.run_tag = run_tag
        self.mixed = len(models) > 1
        self.routed = len(targets) > 1

    def model_of(self, kind: str, key: int) -> int:
        if not self.mixed:
            return 0
        u = unit(self.seed, "model-" + kind, key)
        return next((i for i, c in enumerate(self.cum) if u < c), len(self.cum) - 1)

    def lane_of(self, kind: str, key: int) -> int:
        n = len(self.targets)
        if n == 1:
            return 0
        if self.routing == "round-robin":
            return key % n
        return int(unit(0, "target-" + kind, key) * n)

    def _route(self, kind: str, key: int, name: str) -> Route:
        if not (self.mixed or self.routed or self.routing == "session"):
            return NO_ROUTE  # one model, one target: nothing to draw or name
        m, lane = self.model_of(kind, key), self.lane_of(kind, key)
        return Route(
            lane=lane,
            model_idx=m,
            model=self.models[m] if self.mixed else None,
            target=self.targets[lane] if self.routed else None,
            session=name if self.routing == "session" else None,
        )

    def request(self, index: int) -> Route:
        """A single request's route (a request is its own session), by its global index."""
        return self._route("request", index, f"{self.run_tag}-r{index}")

    def session(self, s: int) -> Route:
        """A session's route (every request of it), by its number."""
        return self._route("session", s, f"{self.run_tag}-s{s}")


def split_several(data: object) -> object:
    """A spec's raw fields with a mix written as text in ``model`` (``a:0.7,b:0.3``) moved to
    ``model_mix``, several URLs in ``base_url`` (comma-separated) to ``base_urls``, and
    ``model`` / ``base_url`` not given taken from the first of those."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    model, base = out.get("model"), out.get("base_url")
    if isinstance(model, str) and "," in model and not out.get("model_mix"):
        mix = parse_mix_text("model", model)
        out["model_mix"] = [s.model_dump() for s in mix]
        out["model"] = mix[0].model
    if out.get("model") is None and isinstance(out.get("model_mix"), list) and out["model_mix"]:
        first = out["model_mix"][0]
        name = first.get("model") if isinstance(first, dict) else getattr(first, "model", None)
        if isinstance(name, str):
            out["model"] = name
    if isinstance(base, str) and "," in base and not out.get("base_urls"):
        urls = [u.strip() for u in base.split(",")]
        if any(not u for u in urls):
            raise ValueError("base_url: an empty URL in the comma-separated list")
        out["base_urls"], out["base_url"] = urls, urls[0]
    urls_given = out.get("base_urls")
    if out.get("base_url") is None and isinstance(urls_given, list) and urls_given:
        out["base_url"] = str(urls_given[0]).rstrip("/")
    return out
