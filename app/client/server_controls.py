"""The server's controls around a run's measured window (``ServerControls``), which the
runner calls at two points: right after the warm-ups, before the first measured request
(``before_measure``), and right after the last measured request ended
(``after_measure``; the run's end time is taken before it, so it never counts in the run).

* ``reset_prefix_cache``: ``POST /reset_prefix_cache`` (vLLM), else ``POST /flush_cache``
  (SGLang) when the first is missing (404/405). After the warm-ups, which would otherwise
  fill the cache again. An engine with neither: the run goes on, and its notes say the
  cache was not reset and which control it lacked.
* ``server_profile``: ``POST /start_profile`` before, ``POST /stop_profile`` after (vLLM with
  ``VLLM_TORCH_PROFILER_DIR``, SGLang); the trace's path is kept when the engine says it.
  An engine without the profiler: the run goes on, its notes say so.
* Speculative decoding: with ``scrape_metrics`` (and ``read_counters``: the run is observed,
  as ``app.client.execute`` does; ``run_load``'s ``read_server_counters``), the engine's
  ``/metrics`` is read at both points and the acceptance over the window computed
  (``app.analysis.spec_decode``).

Every answer is bounded (``app.client.bounded_get``): a control's body at most
``MAX_BYTES``, read in ``CONTROL_TIMEOUT_S`` (``PROFILE_STOP_TIMEOUT_S`` for a profiler
that writes its trace when stopped); what is kept of it is cleaned (no control characters,
at most ``MAX_TEXT_CHARS``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from app.analysis.spec_decode import NAMES as SPEC_NAMES
from app.analysis.spec_decode import reading_key, rises, spec_decode
from app.client.bounded_get import get_bounded
from app.client.metrics_scraper import MAX_SCRAPE_BYTES, parse_blocks
from app.client.server_identity import MAX_TEXT_CHARS, auth_headers, clean_text, control_base
from app.client.spec import RunSpec
from app.protocol.prometheus import PrometheusFormatError

STATS_KEY = "server_controls"
RESET_PATHS = ("/reset_prefix_cache", "/flush_cache")  # vLLM's, then SGLang's
MISSING = (404, 405)  # an engine without the control
MAX_BYTES = 64 << 10
CONTROL_TIMEOUT_S = 30.0
PROFILE_STOP_TIMEOUT_S = 120.0
READING_TIMEOUT_S = 5.0
TRACE_KEYS = ("trace_path", "path", "trace_file", "profile_path", "output_dir", "trace_dir")


def metrics_url(spec: RunSpec) -> str | None:
    """Where to scrape: ``spec.metrics_url``, else ``base_url`` + ``/metrics`` (``/v1`` cut);
    None when scraping is off."""
    if not spec.scrape_metrics:
        return None
    if spec.metrics_url:
        return spec.metrics_url
    return f"{control_base(spec.base_url)}/metrics"


def trace_path(body: bytes) -> str | None:
    """The trace's path in a profiler's answer (a JSON object's ``trace_path`` or the like),
    cleaned; None when it says none."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict):
        return None
    for key in TRACE_KEYS:
        v = obj.get(key)
        if isinstance(v, str) and v.strip():
            return clean_text(v.strip(), MAX_TEXT_CHARS)
    return None


def _authorize(client: httpx.Client, spec: RunSpec, url: str) -> None:
    """The run's key on ``client`` for ``url``, only where it may go (``auth_headers``)."""
    client.headers.pop("Authorization", None)
    client.headers.update(auth_headers(spec, url))


def target_metrics_url(spec: RunSpec, base: str) -> str:
    """Where a target's counters are read: ``spec.metrics_url`` for a run of one target,
    else the target's base URL + ``/metrics``."""
    if spec.metrics_url and not spec.base_urls:
        return spec.metrics_url
    return f"{control_base(base)}/metrics"


class ServerControls:
    """One run's controls (``wanted`` says whether it has any), on each of its targets
    (``RunSpec.targets``). ``record`` goes to the run's load statistics (``STATS_KEY``),
    ``notes`` to its validity notes. A run of one target records each control's outcome as
    it is; a run of several records each target's under ``targets`` (keyed by its base URL)
    beside the whole (reset: every target reset; profiled: any started; speculative
    decoding: over the targets' counters summed), and each note names its target."""

    def __init__(self, spec: RunSpec, *, read_counters: bool = True) -> None:
        self.spec = spec
        self.read_counters = read_counters and spec.scrape_metrics
        self.targets = spec.targets()
        self.several = len(self.targets) > 1
        self.record: dict[str, Any] = {}
        self.notes: list[str] = []
        self._readings: dict[str, dict[str, float] | None] = {}
        self._profiles: dict[str, dict[str, Any]] = {}  # base -> its profiler's entry
        self._started = False
        # built here, before the warm-ups: an httpx client loads its CA bundle (~0.1-0.2 s),
        # which must not fall between the warm-ups and the first measured request
        self._http = httpx.Client(timeout=CONTROL_TIMEOUT_S, trust_env=False)

    @staticmethod
    def wanted(spec: RunSpec, read_counters: bool = True) -> bool:
        return (
            spec.reset_prefix_cache
            or spec.server_profile
            or (read_counters and spec.scrape_metrics)
        )

    async def before_measure(self, targets: list[str] | None = None) -> None:
        """``targets``: those of the run's targets the controls may reach (the runner leaves
        out one whose address could not be resolved or was refused); None: all of them."""
        if targets is not None:
            self.targets = [t for t in self.targets if t in targets]
        self._started = True
        await asyncio.to_thread(self._before)

    async def after_measure(self) -> None:
        """Once, then the client is closed; a run that never reached its measured window
        (``before_measure`` not called) sends nothing."""
        try:
            if self._started:
                self._started = False
                await asyncio.to_thread(self._after)
        finally:
            self._http.close()

    def _note(self, base: str, text: str) -> None:
        """A note of one target's control; a run of several names the target."""
        self.notes.append(f"{base}: {text}" if self.several else text)

    def _post(
        self, client: httpx.Client, base: str, path: str, timeout_s: float
    ) -> tuple[int | None, bytes, str]:
        """(status, body, why): status None when the engine could not be reached. The run's
        key goes only where it may (``auth_headers``)."""
        url = control_base(base) + path
        _authorize(client, self.spec, url)
        try:
            ans = get_bounded(
                client,
                url,
                max_bytes=MAX_BYTES,
                deadline_s=timeout_s,
                method="POST",
                timeout_s=timeout_s,
            )
        except httpx.HTTPError as e:
            return None, b"", f"could not reach it ({type(e).__name__})"
        if ans.body is None:
            return ans.status, b"", f"HTTP {ans.status}, answer not read: {ans.error}"
        return ans.status, ans.body, f"HTTP {ans.status}"

    def _before(self) -> None:
        client = self._http
        if self.spec.reset_prefix_cache:
            resets = {base: self._reset(client, base) for base in self.targets}
            self.record["prefix_cache_reset"] = self._whole(
                resets, reset=all(r["reset"] for r in resets.values())
            )
        if self.read_counters:
            self._readings = {base: self._read_counters(client, base) for base in self.targets}
        if self.spec.server_profile:  # last: the profiles start right before the window
            self._profiles = {base: self._start_profile(client, base) for base in self.targets}
            self._record_profiles()

    def _after(self) -> None:
        client = self._http
        for base, prof in self._profiles.items():
            if prof["started"]:
                self._stop_profile(client, base, prof)
        if self._profiles:
            self._record_profiles()
        pairs: dict[str, tuple[dict[str, float], dict[str, float]]] = {}
        for base, start in self._readings.items():
            end = self._read_counters(client, base) if start is not None else None
            if start is not None and end is not None:
                pairs[base] = (start, end)
        figures = {b: f for b, (s, e) in pairs.items() if (f := spec_decode(s, e)) is not None}
        if not figures:
            return
        if not self.several:
            self.record["spec_decode"] = next(iter(figures.values()))
            return
        whole = spec_decode({}, rises([pairs[b] for b in figures]))
        if whole is not None:
            self.record["spec_decode"] = whole | {"targets": figures}

    def _whole(self, by_target: dict[str, dict[str, Any]], **whole: Any) -> dict[str, Any]:
        """One target's entry as it is; several: ``whole`` and each target's entry."""
        if not self.several:
            return next(iter(by_target.values()))
        return whole | {"targets": by_target}

    def _record_profiles(self) -> None:
        profs = self._profiles
        started = [p for p in profs.values() if p["started"]]
        self.record["profile"] = self._whole(
            {b: dict(p) for b, p in profs.items()},
            started=bool(started),
            stopped=bool(started) and all(p["stopped"] for p in started),
        )

    def _reset(self, client: httpx.Client, base: str) -> dict[str, Any]:
        tried: list[str] = []
        for path in RESET_PATHS:
            status, _, why = self._post(client, base, path, CONTROL_TIMEOUT_S)
            tried.append(f"POST {path} ({why})")
            if status == 200:
                return {"reset": True, "via": f"POST {path}"}
            if status not in MISSING:
                break  # the engine has it and it failed, or could not be reached
        lacking = all(t.endswith(("(HTTP 404)", "(HTTP 405)")) for t in tried)
        if lacking:
            self._note(
                base,
                "prefix cache not reset: the server has no "
                + " nor ".join(tried)
                + "; the run went on with whatever the cache held",
            )
        else:
            self._note(
                base,
                f"prefix cache not reset: {tried[-1]}; the run went on with whatever the "
                "cache held",
            )
        return {"reset": False, "tried": tried}

    def _start_profile(self, client: httpx.Client, base: str) -> dict[str, Any]:
        status, body, why = self._post(client, base, "/start_profile", CONTROL_TIMEOUT_S)
        if status == 200:
            prof: dict[str, Any] = {"started": True, "stopped": False}
            path = trace_path(body)
            if path is not None:
                prof["trace_path"] = path
            return prof
        if status in MISSING:
            self._note(
                base,
                f"not profiled: the server has no POST /start_profile ({why}); vLLM serves "
                "it when started with VLLM_TORCH_PROFILER_DIR set",
            )
        else:
            self._note(base, f"not profiled: POST /start_profile answered {why}")
        return {"started": False, "error": f"POST /start_profile ({why})"}

    def _stop_profile(self, client: httpx.Client, base: str, prof: dict[str, Any]) -> None:
        status, body, why = self._post(client, base, "/stop_profile", PROFILE_STOP_TIMEOUT_S)
        if status == 200:
            prof["stopped"] = True
            path = trace_path(body)
            if path is not None:
                prof["trace_path"] = path
            return
        prof["error"] = f"POST /stop_profile ({why})"
        self._note(base, f"the server's profiler may still run: POST /stop_profile answered {why}")

    def _read_counters(self, client: httpx.Client, base: str) -> dict[str, float] | None:
        """The target's speculative-decoding counters now (``reading_key`` -> summed
        value); None when its ``/metrics`` could not be read."""
        url = target_metrics_url(self.spec, base)
        _authorize(client, self.spec, url)
        try:
            ans = get_bounded(client, url, max_bytes=MAX_SCRAPE_BYTES, deadline_s=READING_TIMEOUT_S)
        except httpx.HTTPError:
            return None
        if ans.status != 200 or ans.body is None:
            return None
        try:
            samples, _ = parse_blocks(ans.body.decode("utf-8", "replace"), SPEC_NAMES)
        except PrometheusFormatError:
            return None
        out: dict[str, float] = {}
        for s in samples:
            key = reading_key(s.name, dict(s.labels))
            if key is not None:
                out[key] = out.get(key, 0.0) + s.value
        return out
