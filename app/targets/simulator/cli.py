"""``tokentrace sim`` (and ``python -m app.targets.simulator``): the options
(``build_arg_parser``, also added to the ``tokentrace`` subparser), the ``SimConfig`` they
make (``config_from_args``; ``--config-json`` is how ``SimulatorProcess`` passes a whole
config), and ``main``: serve until SIGINT/SIGTERM, print the ``listening on URL`` line a
parent process waits for, exit 2 on bad arguments or an unloadable certificate, 1 when it
cannot listen.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from app.targets.sim_config import SimConfig
from app.targets.simulator.handles import client_url
from app.targets.simulator.server import serve, server_ssl_context


class _UsageError(Exception):
    pass


class _ArgParser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse prints two lines and exits; we raise
        raise _UsageError(message)


def build_arg_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The ``tokentrace sim`` options (added to ``parser`` when given, e.g. a subparser)."""
    p = parser or _ArgParser(
        prog="tokentrace sim", description="Deterministic OpenAI-compatible streaming simulator."
    )
    d = SimConfig()
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--model", default=d.model)
    p.add_argument("--ttft-ms", type=float, default=d.ttft_ms)
    p.add_argument("--per-input-token-ms", type=float, default=d.per_input_token_ms)
    p.add_argument("--itl-ms", type=float, default=d.itl_ms)
    p.add_argument("--itl-jitter-ms", type=float, default=d.itl_jitter_ms)
    p.add_argument("--itl-per-active-ms", type=float, default=d.itl_per_active_ms)
    p.add_argument("--tokens-per-event", type=int, default=d.tokens_per_event)
    p.add_argument("--no-role-chunk", action="store_true", help="omit the role-only chunk")
    p.add_argument(
        "--output-len",
        type=int,
        default=d.output_len,
        help="tokens when a request has no max_tokens",
    )
    p.add_argument(
        "--eos-len",
        type=int,
        default=None,
        help="stop after this many tokens unless ignore_eos/min_tokens say otherwise",
    )
    p.add_argument("--reasoning-tokens", type=int, default=d.reasoning_tokens)
    p.add_argument(
        "--embedding-dim",
        type=int,
        default=d.embedding_dim,
        help="an embedding's length (embeddings surface), unless a request asks dimensions",
    )
    p.add_argument(
        "--tool-call-rate",
        type=float,
        default=d.tool_call_rate,
        help="the share of chat requests carrying tools answered by a tool call (seeded)",
    )
    p.add_argument(
        "--image-tokens",
        type=int,
        default=d.image_tokens,
        help="prompt tokens each image part of a chat message counts (usage)",
    )
    p.add_argument("--error-rate", type=float, default=0.0)
    p.add_argument("--disconnect-rate", type=float, default=0.0)
    p.add_argument("--stall-rate", type=float, default=0.0)
    p.add_argument("--malformed-rate", type=float, default=0.0)
    p.add_argument("--hang-rate", type=float, default=0.0)
    p.add_argument("--fault-after-tokens", type=int, default=None)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--prefix-cache-block",
        type=int,
        default=d.prefix_cache_block,
        metavar="TOKENS",
        help="cache prompt prefixes in blocks of this many tokens (0: no prefix cache)",
    )
    p.add_argument(
        "--prefix-cache-reset",
        choices=("vllm", "sglang", "none"),
        default=d.prefix_cache_reset,
        help="the cache reset served: vllm POST /reset_prefix_cache, sglang POST /flush_cache",
    )
    p.add_argument("--no-profiler", action="store_true", help="no /start_profile, /stop_profile")
    p.add_argument("--no-identity", action="store_true", help="no /version, /server_info")
    p.add_argument("--max-model-len", type=int, default=d.max_model_len)
    p.add_argument(
        "--spec-decode-draft-len",
        type=int,
        default=d.spec_decode_draft_len,
        metavar="K",
        help="simulate speculative decoding with K draft tokens per step (0: off)",
    )
    p.add_argument(
        "--spec-decode-acceptance",
        type=float,
        default=d.spec_decode_acceptance,
        metavar="P",
        help="each draft token's acceptance probability (seeded)",
    )
    p.add_argument(
        "--tls-certfile",
        default=None,
        metavar="PEM",
        help="serve https with this certificate (chain); needs --tls-keyfile",
    )
    p.add_argument(
        "--tls-keyfile", default=None, metavar="PEM", help="private key of --tls-certfile"
    )
    p.add_argument(
        "--no-ground-truth",
        action="store_true",
        help="do not keep per-event ground truth (long runs)",
    )
    p.add_argument(
        "--no-keep-alive", action="store_true", help="close every connection after its response"
    )
    p.add_argument(
        "--idle-timeout-s",
        type=float,
        default=d.idle_timeout_s,
        help="close a kept-alive connection left idle this long (0: never)",
    )
    p.add_argument(
        "--max-requests-per-conn",
        type=int,
        default=d.max_requests_per_conn,
        help="answer at most this many requests on one connection (0: no cap)",
    )
    p.add_argument("--config-json", default=None, help=argparse.SUPPRESS)
    return p


def config_from_args(ns: argparse.Namespace) -> SimConfig:
    """A ``SimConfig`` from parsed options; raises ValueError with a one-line reason."""
    if ns.config_json:
        data = json.loads(ns.config_json)
        if not isinstance(data, dict):
            raise ValueError("--config-json must be a JSON object")
        return SimConfig.from_dict(data)
    return SimConfig(
        host=ns.host,
        port=ns.port,
        model=ns.model,
        ttft_ms=ns.ttft_ms,
        per_input_token_ms=ns.per_input_token_ms,
        itl_ms=ns.itl_ms,
        itl_jitter_ms=ns.itl_jitter_ms,
        itl_per_active_ms=ns.itl_per_active_ms,
        tokens_per_event=ns.tokens_per_event,
        role_chunk=not ns.no_role_chunk,
        output_len=ns.output_len,
        eos_len=ns.eos_len,
        reasoning_tokens=ns.reasoning_tokens,
        embedding_dim=ns.embedding_dim,
        tool_call_rate=ns.tool_call_rate,
        image_tokens=ns.image_tokens,
        error_rate=ns.error_rate,
        disconnect_rate=ns.disconnect_rate,
        stall_rate=ns.stall_rate,
        malformed_rate=ns.malformed_rate,
        hang_rate=ns.hang_rate,
        fault_after_tokens=ns.fault_after_tokens,
        seed=ns.seed,
        prefix_cache_block=ns.prefix_cache_block,
        prefix_cache_reset=ns.prefix_cache_reset,
        profiler=not ns.no_profiler,
        identity=not ns.no_identity,
        max_model_len=ns.max_model_len,
        spec_decode_draft_len=ns.spec_decode_draft_len,
        spec_decode_acceptance=ns.spec_decode_acceptance,
        record_ground_truth=not ns.no_ground_truth,
        keep_alive=not ns.no_keep_alive,
        idle_timeout_s=ns.idle_timeout_s,
        max_requests_per_conn=ns.max_requests_per_conn,
        tls_certfile=ns.tls_certfile,
        tls_keyfile=ns.tls_keyfile,
    )


async def _serve_until_signal(config: SimConfig) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)

    def ready(port: int) -> None:
        print(
            f"tokentrace sim: listening on {client_url(config.host, port, config.tls)} "
            f"(pid {os.getpid()})",
            flush=True,
        )

    gc.freeze()  # start-up objects never need scanning again: shorter collections
    with contextlib.suppress(asyncio.CancelledError):
        await serve(config, on_ready=ready)


def main(argv: Sequence[str] | None = None) -> int:
    """``tokentrace sim``: 0 when stopped by a signal, 2 on bad arguments, 1 if it cannot bind."""
    parser = build_arg_parser()
    try:
        ns = parser.parse_args(argv)
        config = config_from_args(ns)
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except (_UsageError, ValueError) as e:
        print(f"tokentrace sim: error: {e}", file=sys.stderr)
        return 2
    try:
        server_ssl_context(config)  # a bad certificate or key is a usage error, not a bind one
    except OSError as e:
        print(f"tokentrace sim: error: cannot load the TLS certificate/key: {e}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_serve_until_signal(config))
    except OSError as e:
        print(
            f"tokentrace sim: error: cannot listen on {config.host}:{config.port}: {e}",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        pass
    return 0
