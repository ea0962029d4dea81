"""The simulator server: ``SimServer`` binds the listening socket (TLS when configured,
``server_ssl_context``), starts the scheduler task, routes each whole request (every path of
every registered surface, ``app.targets.simulator.surfaces.ROUTES``; ``/v1/models``,
``/health``, ``/metrics``, ``/_sim/ground_truth``, ``/_sim/reset``), turns a surface's
request into its plan (its handler's), fault, ground-truth record and generation (a stream,
``generator.Gen``, or one whole answer, ``answer.Answer``), and holds the state they share:
the request counter, the batch counters and the records. ``serve`` runs it until cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
from collections.abc import Callable
from typing import Any

import h11

from app.targets.sim_config import Fault, SimConfig
from app.targets.simulator import controls
from app.targets.simulator.answer import Answer
from app.targets.simulator.generator import Gen, build_tape
from app.targets.simulator.http import HttpProtocol, error_body, json_bytes
from app.targets.simulator.metrics import metrics_text
from app.targets.simulator.plan import BadRequest, Plan, decide_fault
from app.targets.simulator.prefix_cache import PrefixCache
from app.targets.simulator.records import EVENT_KINDS, K_ERROR, K_ROLE, Record
from app.targets.simulator.scheduler import Scheduler
from app.targets.simulator.spec_decode import SpecCounts, request_counts
from app.targets.simulator.stamps import clock_offset, listen_socket
from app.targets.simulator.surfaces import HANDLERS, routes
from app.targets.simulator.surfaces.base import Surface


class SimServer:
    """The simulator's state and routes; ``start()`` binds, ``close()`` stops."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.surfaces = routes(HANDLERS)  # every path of every registered surface
        self.tape = build_tape(config.seed)
        self.per_active_ns = round(config.itl_per_active_ms * 1e6)
        self.port = 0
        self.waiting = 0
        self.running = 0
        self.kv_tokens = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.success_total = 0
        self.requests_by_fault: dict[str, int] = {f.value: 0 for f in Fault}
        self.prefix_cache = (
            PrefixCache(config.prefix_cache_block, config.prefix_cache_blocks)
            if config.prefix_cache_block
            else None
        )
        self.spec = SpecCounts(accepted_per_pos=[0] * config.spec_decode_draft_len)
        self.controls = controls.ControlLog()
        self._control_routes = controls.routes(config)
        self._seq = 0
        self.connections_accepted = 0
        self.clock_offset_ns = clock_offset()
        self._records: dict[str, Record] = {}
        self._conns: set[HttpProtocol] = set()
        self._sched = Scheduler(config.spin_us * 1000)
        self._server: asyncio.base_events.Server | None = None
        self._clock_timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._accepted,
            sock=listen_socket(self.config.host, self.config.port, self.config.kernel_rx_stamps),
            backlog=4096,
            ssl=server_ssl_context(self.config),
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._resample_clock()
        self._task = asyncio.create_task(self._sched.run(), name="tokentrace-sim-scheduler")
        return self.port

    async def close(self) -> None:
        if self._clock_timer is not None:
            self._clock_timer.cancel()
        if self._server is not None:
            self._server.close()
        for proto in list(self._conns):
            if proto.transport is not None:
                proto.transport.abort()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._sched.clear()
        if self._server is not None:
            await self._server.wait_closed()

    def _accepted(self) -> HttpProtocol:
        self.connections_accepted += 1
        return HttpProtocol(self, self.connections_accepted)

    def _resample_clock(self) -> None:
        """``realtime - monotonic`` for the kernel stamps, about once a second."""
        self.clock_offset_ns = clock_offset()
        self._clock_timer = asyncio.get_running_loop().call_later(1.0, self._resample_clock)

    def track(self, proto: HttpProtocol) -> None:
        self._conns.add(proto)

    def untrack(self, proto: HttpProtocol) -> None:
        self._conns.discard(proto)

    # ground truth -------------------------------------------------------------
    def ground_truth(self) -> dict[str, Any]:
        return {
            "clock": "monotonic_ns",
            "pid": os.getpid(),
            "config": self.config.to_dict(),
            "event_kinds": list(EVENT_KINDS),
            "connections_accepted": self.connections_accepted,
            "requests": {rid: r.to_json() for rid, r in self._records.items()},
            "spec_decode": self.spec.to_json(),
            "controls": list(self.controls.calls),
            "prefix_cache_blocks_held": len(self.prefix_cache) if self.prefix_cache else 0,
        }

    def count_spec(self, seq: int, output_tokens: int, rec: Record | None) -> None:
        """A request generated ``output_tokens`` whole: its draft steps into the counters
        (and its ground truth)."""
        cfg = self.config
        if not cfg.spec_decode_draft_len:
            return
        counts = request_counts(
            cfg.seed, seq, output_tokens, cfg.spec_decode_draft_len, cfg.spec_decode_acceptance
        )
        self.spec.add(counts)
        if rec is not None:
            rec.spec = counts.to_json()

    def reset(self) -> None:
        """Forget the ground truth and restart the request counter (faults repeat)."""
        self._records.clear()
        self._seq = 0
        self.connections_accepted = 0

    # routing --------------------------------------------------------------------
    def handle(self, proto: HttpProtocol, req: h11.Request, body: bytes, received_ns: int) -> None:
        method = req.method.decode("latin-1").upper()
        path = req.target.decode("latin-1").split("?", 1)[0].rstrip("/") or "/"
        surface = self.surfaces.get(path)
        if surface is not None:  # an API surface: the hot path, no route table built
            if method != "POST":
                proto.send_simple(405, error_body(f"{method} not allowed", "invalid_request", 405))
            else:
                self._complete(proto, req, body, received_ns, surface, path)
            return
        routes: dict[str, tuple[str, Callable[[], object]]] = {
            "/health": ("GET", lambda: proto.send_simple(200, b'{"status":"ok"}')),
            "/v1/models": ("GET", lambda: proto.send_simple(200, self._models())),
            "/metrics": (
                "GET",
                lambda: proto.send_simple(
                    200, self.metrics_text().encode(), "text/plain; version=0.0.4"
                ),
            ),
            "/_sim/ground_truth": (
                "GET",
                lambda: proto.send_simple(200, json_bytes(self.ground_truth())),
            ),
            "/_sim/reset": ("POST", lambda: self._reset_route(proto)),
        }
        control = self._control_routes.get(path)
        if control is not None:
            routes[path] = (controls.method_of(control), lambda: self._control(proto, control))
        route = routes.get(path)
        if route is None:
            proto.send_simple(404, error_body(f"no route {path}", "not_found", 404))
        elif method != route[0]:
            proto.send_simple(405, error_body(f"{method} not allowed", "invalid_request", 405))
        else:
            route[1]()

    def _reset_route(self, proto: HttpProtocol) -> None:
        self.reset()
        proto.send_simple(200, b'{"ok":true}')

    def _control(self, proto: HttpProtocol, control: str) -> None:
        ans = controls.answer(control, self.config, self.controls, self.prefix_cache, self._seq)
        proto.send_simple(200, json_bytes(ans))

    def _models(self) -> bytes:
        return json_bytes(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.config.model,
                        "object": "model",
                        "created": 0,
                        "owned_by": "tokentrace-sim",
                        "max_model_len": self.config.max_model_len,
                    }
                ],
            }
        )

    def _complete(
        self,
        proto: HttpProtocol,
        req: h11.Request,
        body: bytes,
        received_ns: int,
        surface: Surface,
        path: str,
    ) -> None:
        try:
            payload = json.loads(body)
            if not isinstance(payload, dict):
                raise BadRequest("the body must be a JSON object")
            plan = surface.plan(payload, path, self.config)
            tokens = surface.prompt_tokens(payload) if self.prefix_cache is not None else None
            if self.prefix_cache is not None and tokens is not None:
                plan.cached_tokens = self.prefix_cache.lookup(tokens, plan.input_tokens)
        except (ValueError, RecursionError) as e:
            proto.send_simple(400, error_body(str(e), "invalid_request_error", 400))
            return
        self._seq += 1
        seq = self._seq
        proto.request_id = self._request_id(req, seq)
        fault = decide_fault(self.config, seq)
        self.requests_by_fault[fault.value] += 1
        self.prompt_tokens_total += plan.input_tokens
        rec = Record(seq, plan, fault, received_ns)
        rec.session = next(
            (v.decode("latin-1") for k, v in req.headers if k.lower() == b"x-session-id"), None
        )
        proto.note_request(rec)
        if self.config.record_ground_truth:
            self._records[proto.request_id] = rec
            proto.record = rec
        if fault is Fault.ERROR:
            t = proto.send_simple(500, error_body("simulated server error", "server_error", 500))
            rec.status, rec.headers_ns, rec.fault_ns = 500, t, t
            rec.add(t, received_ns, K_ERROR, 0)
            return
        if fault is Fault.HANG:
            rec.fault_ns = received_ns
            return
        self._begin(proto, rec, plan, seq, fault, received_ns)

    def _begin(
        self,
        proto: HttpProtocol,
        rec: Record,
        plan: Plan,
        seq: int,
        fault: Fault,
        received_ns: int,
    ) -> None:
        kept = rec if self.config.record_ground_truth else None
        self.waiting += 1
        self.kv_tokens += plan.input_tokens
        if plan.shape is None:  # one whole answer (a surface that does not generate)
            answer = Answer(self, proto, kept, plan, fault)
            proto.gen = answer
            self._sched.add(answer.first_due(received_ns), answer)
            return
        gen = Gen(self, proto, kept, plan, seq, fault)
        proto.gen = gen
        if plan.stream:
            # an event shape's opening events are always written (its usage may be there)
            role = (self.config.role_chunk and plan.shape.role_chunk) or gen.events is not None
            t = proto.start_stream(gen.role_chunk() if role else b"")
            rec.headers_ns, rec.status = t, 200
            if role:
                rec.add(t, received_ns, K_ROLE, 0)
        self._sched.add(gen.first_due(received_ns), gen)

    def _request_id(self, req: h11.Request, seq: int) -> str:
        rid = ""
        for name, value in req.headers.raw_items():  # a list: no Sequence protocol per item
            if name.lower() == b"x-request-id":
                rid = value.decode("latin-1").strip()
        rid = rid or f"sim-{seq}"
        if rid in self._records:
            rid = f"{rid}#{seq}"
        return rid

    # metrics ------------------------------------------------------------------
    def metrics_text(self) -> str:
        return metrics_text(self, len(self._conns))


async def serve(config: SimConfig, *, on_ready: Callable[[int], None] | None = None) -> None:
    """Run the simulator until cancelled; ``on_ready(port)`` is called once it listens."""
    server = SimServer(config)
    await server.start()
    try:
        if on_ready is not None:
            on_ready(server.port)
        await asyncio.Event().wait()
    finally:
        await server.close()


def server_ssl_context(config: SimConfig) -> ssl.SSLContext | None:
    """The server-side TLS context when the config asks for https, else None. Raises
    ``OSError`` (``ssl.SSLError`` is one) when the certificate or key cannot be loaded."""
    if config.tls_certfile is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(config.tls_certfile, config.tls_keyfile)
    return ctx
