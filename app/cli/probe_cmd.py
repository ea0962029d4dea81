"""``tokentrace probe``: run a GPU probe here (``run``) or queue it on a server
(``submit``), list stored probes, and plan capacity (``capacity``).

Exit codes: 0 success, 1 the probe failed (one-line reason, e.g. CUDA asked for and
missing), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from app.cli.args import Parser, UsageError
from app.cli.serve_cmd import Handler

SUBMIT_TOKEN_ENV = "TOKENTRACE_TOKEN"


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:  # type: ignore[type-arg]
    """Add this module's subcommands to ``sub``; return command name -> handler."""
    p = sub.add_parser("probe", help="GPU probes (ceilings, linear, batch_scaling) and capacity")
    psub = p.add_subparsers(dest="probe_command", required=True, parser_class=Parser)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("kind", choices=("ceilings", "linear", "batch_scaling"))
        q.add_argument(
            "--device",
            choices=("cuda", "cpu"),
            default="cuda",
            help="cuda (default; fails clearly without CUDA) or cpu on purpose",
        )
        q.add_argument("--device-index", type=int, default=0)
        q.add_argument("--name", default=None)
        q.add_argument(
            "--param",
            action="append",
            default=[],
            metavar="KEY=JSON",
            help="a probe parameter, e.g. --param width=1024 --param "
            "batches=[1,4,8] --param model_path=/models/llama",
        )
        q.add_argument("--json", action="store_true")

    run = psub.add_parser("run", help="run a probe in this process and store it")
    common(run)
    run.add_argument("--database-url", default=None)
    sm = psub.add_parser("submit", help="queue a probe job on a tokentrace server")
    common(sm)
    sm.add_argument("--server", required=True)
    sm.add_argument("--token", default=None, help=f"API token (scope run); or ${SUBMIT_TOKEN_ENV}")
    ls = psub.add_parser("list", help="list stored probes")
    ls.add_argument("--database-url", default=None)
    ls.add_argument("--json", action="store_true")
    c = psub.add_parser("capacity", help="how many requests fit / what context fits")
    c.add_argument("--model", default="llama-3-8b", help="a model preset")
    c.add_argument("--device", default="h100-sxm", help="a device preset")
    c.add_argument("--memory-gib", type=float, default=None)
    c.add_argument("--weight-dtype", default="bf16")
    c.add_argument("--kv-dtype", default="bf16")
    c.add_argument("--utilization", type=float, default=0.9)
    c.add_argument("--reserve-gib", type=float, default=0.0)
    c.add_argument("--block-size", type=int, default=16)
    c.add_argument("--context", type=int, default=None)
    c.add_argument("--concurrency", type=int, default=None)
    c.add_argument("--tp", type=int, default=1, help="tensor-parallel size: GPUs the model spans")
    c.add_argument("--json", action="store_true")
    return {"probe": cmd_probe}


def parse_params(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--param: expected KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw  # a plain string such as a path
    return out


def _spec(ns: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from app.probes.spec import ProbeSpec

    try:
        return ProbeSpec(
            kind=ns.kind,
            device=ns.device,
            device_index=ns.device_index,
            name=ns.name,
            params=parse_params(ns.param),
        )
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise UsageError(f"--param {loc}: {err['msg']}") from None


def cmd_probe(ns: argparse.Namespace, console: Console) -> int:
    cmd = ns.probe_command
    if cmd == "run":
        return _run(ns, console)
    if cmd == "submit":
        return _submit(ns, console)
    if cmd == "list":
        return _list(ns, console)
    return _capacity(ns, console)


def _sessions(url: str | None) -> Any:
    from app.services.runs import open_database
    from app.settings import get_settings

    return open_database(url or get_settings().database_url)


def _run(ns: argparse.Namespace, console: Console) -> int:
    from app.probes.device import ProbeError
    from app.probes.runner import run_probe
    from app.services import probes as svc
    from app.settings import get_settings
    from app.storage.db import session_scope

    spec = _spec(ns)
    sessions = _sessions(ns.database_url)
    cap = int(get_settings().probe_artifact_max_mb * 1024 * 1024)
    try:
        out = run_probe(spec)
    except ProbeError as e:
        with session_scope(sessions) as s:
            pid = svc.store_local(
                s,
                spec,
                fingerprint=None,
                result=None,
                telemetry=[],
                artifacts=[],
                error=str(e),
                max_artifact_bytes=cap,
            )
        sys.stderr.write(f"tokentrace probe: error: {e} (stored as failed probe {pid})\n")
        return 1
    with session_scope(sessions) as s:
        pid = svc.store_local(
            s,
            spec,
            fingerprint=out.fingerprint,
            result=out.result,
            telemetry=out.telemetry,
            artifacts=[(a.name, a.content_type, a.data) for a in out.artifacts],
            error=None,
            max_artifact_bytes=cap,
        )
    if ns.json:
        print(
            json.dumps(
                {"probe_id": pid, "fingerprint": out.fingerprint, "result": out.result}, default=str
            )
        )
        return 0
    label = out.fingerprint.get("label")
    console.print(f"probe [bold]{pid}[/bold] ({spec.kind} on {label}) stored")
    for line in summary_lines(spec.kind, out.result):
        console.print(f"  {line}")
    return 0


def summary_lines(kind: str, r: dict[str, Any]) -> list[str]:
    """A few human lines about a probe result (also used by benchmarks/gpu_check)."""
    if kind == "ceilings":
        c = r.get("ceilings") or {}
        lines = [f"bandwidth {(c.get('bandwidth_bps') or 0) / 1e9:.1f} GB/s (median, best size)"]
        lines += [f"{d}: {v / 1e12:.3g} TFLOP/s" for d, v in (c.get("flops") or {}).items()]
        return lines + [f"skipped {s}" for s in r.get("skipped") or []]
    if kind == "linear":
        out = []
        for label, row in (r.get("shapes") or {}).items():
            out.append(
                f"{label}: M={row['m']} {row['median_ms']:.3f} ms, "
                f"{row['flops_s'] / 1e12:.3f} TFLOP/s, {row['bytes_s'] / 1e9:.1f} GB/s"
            )
        return out
    rows = [x for x in r.get("rows") or [] if "error" not in x]
    out = [
        f"batch {x['batch']}: TTFT {x['ttft_ms']:.1f} ms, TPOT {x['tpot_ms']:.2f} ms, "
        f"{x['tokens_per_s']:.1f} tok/s"
        for x in rows
    ]
    return [*out, f"knee: {(r.get('knee') or {}).get('explanation')}"]


def _submit(ns: argparse.Namespace, console: Console) -> int:
    import httpx

    spec = _spec(ns)
    token = ns.token or os.environ.get(SUBMIT_TOKEN_ENV)
    if not token:
        raise UsageError(f"--token: required (or set {SUBMIT_TOKEN_ENV})")
    if not ns.server.startswith(("http://", "https://")):
        raise UsageError(f"--server: must start with http:// or https://, got {ns.server!r}")
    try:
        r = httpx.post(
            f"{ns.server.rstrip('/')}/api/v1/probes",
            json=spec.model_dump(),
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
            trust_env=False,
        )
    except httpx.TransportError as e:
        sys.stderr.write(f"tokentrace probe: error: server unreachable: {e}\n")
        return 1
    if r.status_code != 201:
        sys.stderr.write(f"tokentrace probe: error: HTTP {r.status_code}: {r.text[:300]}\n")
        return 1
    body = r.json()
    if ns.json:
        print(json.dumps(body))
    else:
        console.print(
            f"queued probe {body['probe_id']} (job {body['job_id']}); a worker "
            "started with --kind probe runs it"
        )
    return 0


def _list(ns: argparse.Namespace, console: Console) -> int:
    from app.services import probes as svc
    from app.storage.db import session_scope

    with session_scope(_sessions(ns.database_url)) as s:
        items = svc.list_views(s, limit=200)
    if ns.json:
        print(json.dumps(items, default=str))
        return 0
    t = Table("id", "kind", "device", "status", "created")
    for p in items:
        t.add_row(
            p["id"], p["kind"], str(p["device_label"]), p["status"], str(p["created_at"])[:19]
        )
    console.print(t)
    return 0


def _capacity(ns: argparse.Namespace, console: Console) -> int:
    from app.services import probes as svc
    from app.services.errors import ServiceError

    try:
        q = svc.CapacityQuery(
            model=ns.model,
            device=ns.device or None,
            memory_gib=ns.memory_gib,
            weight_dtype=ns.weight_dtype,
            kv_dtype=ns.kv_dtype,
            utilization=ns.utilization,
            reserve_gib=ns.reserve_gib,
            block_size=ns.block_size,
            context=ns.context,
            concurrency=ns.concurrency,
            tp=ns.tp,
        )
        out = svc.capacity(q)
    except ServiceError as e:
        field = e.loc[-1] if e.loc else None
        raise UsageError(f"{field}: {e.detail}" if field else e.detail) from None
    except ValueError as e:  # pydantic: a bounded field out of range
        raise UsageError(str(e).splitlines()[0] if str(e) else "invalid arguments") from None
    if ns.json:
        print(json.dumps(out))
        return 0
    p = out["plan"]
    gib = 1024**3
    console.print(
        f"{p['model']}: weights {p['weights_bytes'] / gib:.1f} GiB, KV "
        f"{p['kv_bytes_per_token'] / 1024:.0f} KiB/token, KV space "
        f"{p['kv_space_bytes'] / gib:.1f} GiB = {p['num_blocks']} blocks of "
        f"{p['block_size']} = {p['tokens_fit']:,} tokens"
    )
    if p["max_concurrency"] is not None:
        console.print(f"requests of {p['context']} tokens that fit: {p['max_concurrency']}")
    if p["max_context"] is not None:
        console.print(
            f"context per request at concurrency {p['concurrency']}: {p['max_context']:,} tokens"
        )
    for n in p["notes"]:
        console.print(f"[dim]{n}[/dim]")
    return 0
