"""``tokentrace sim``: a deterministic OpenAI-compatible streaming server and ground truth.

Raw asyncio + h11, no web framework. Every active request is one entry in a single heap of
next-emit deadlines served by ONE scheduler task: no task, no sleep per stream per token.
Each SSE event is written with ``transport.write`` right after ``time.monotonic_ns()`` is
stamped, and the stamp, the deadline it was due at, the event kind and its token count are
kept as ground truth (``GET /_sim/ground_truth``, described in ``records``).
``time.monotonic_ns()`` is the clock a client process on the same host sees, so a client's
timings can be checked against it.

Endpoints: every path of every registered API surface (``surfaces``: chat and completions,
streamed or not; embeddings; rerank in vLLM's, Cohere's and TEI's shapes),
``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus text, vLLM-like names),
``GET /_sim/ground_truth``, ``POST /_sim/reset``, and the server controls (``controls``: the
prefix-cache reset, the profiler, ``/version`` and ``/server_info``). The timing model and
the faults are described in ``app.targets.sim_config``. With ``tls_certfile``/``tls_keyfile``
it serves https (asyncio's TLS transport; the stamps are still taken right before
``transport.write``, which encrypts and hands the bytes to the socket in the same call).

Modules, bottom up: ``plan`` (a request's plan, faults, seeded draws), ``records`` (ground
truth), ``stamps`` (kernel receive stamps), ``http`` (one connection: parsing, responses,
keep-alive), ``generator`` (tokens and their timing), ``scheduler`` (the deadline heap),
``metrics`` (Prometheus text), ``prefix_cache``, ``spec_decode`` (speculative decoding's
counters), ``controls`` (the server controls), ``surfaces`` (each surface's handler: its
body's plan, its stream's shape or its whole answer), ``answer`` (one whole answer, written
when due), ``server`` (routes and shared state), ``handles`` (thread and process starters), ``cli``
(``tokentrace sim``); ``python -m app.targets.simulator`` runs
``cli.main``. This package exports the starters the tests, demos and benchmarks use.
"""

from __future__ import annotations

from app.targets.simulator.handles import (
    SimulatorThread,
    start_simulator_process,
    start_simulator_thread,
)

__all__ = ["SimulatorThread", "start_simulator_process", "start_simulator_thread"]
