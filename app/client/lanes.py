"""A run's targets on the load's event loop: one ``Lane`` per base URL (its parsed target,
the surface's path on it, its address resolved once before the clock matters), and the
request head each route sends (``app.client.routing``: the session header where the run
routes by session)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from app.client.http_request import Target, parse_target, request_head, request_headers
from app.client.routing import Route, Router
from app.client.sockets import resolve
from app.client.spec import RunSpec


@dataclass(slots=True)
class Lane:
    """One target of the run."""

    url: str
    target: Target
    path: str  # the surface's path on it
    addr: tuple[int, tuple[object, ...]] | None = None
    resolve_error: str | None = None


def build_lanes(spec: RunSpec, surface_path: str) -> list[Lane]:
    out: list[Lane] = []
    for url in spec.targets():
        target = parse_target(url)
        out.append(Lane(url, target, target.url_path(surface_path)))
    return out


def router_of(spec: RunSpec, run_tag: str) -> Router:
    """The run's ``Router``: its mix (or its one model) and its targets."""
    mix = spec.model_mix
    models = [s.model for s in mix] if mix else [spec.model]
    weights = [s.weight for s in mix] if mix else [1.0]
    return Router(
        models, weights, spec.targets(), routing=spec.routing, seed=spec.seed, run_tag=run_tag
    )


def link_local(host: object) -> bool:
    try:
        ip = ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_link_local


REFUSED_LINK_LOCAL = "resolves to a link-local address, which this worker refuses"


async def link_local_urls(urls: Iterable[str]) -> set[str]:
    """The URLs whose host resolves to a link-local address (any of its addresses: an HTTP
    client may try each): a worker that refuses such targets sends them nothing, not even
    the identity GETs or the /metrics scrape. A name that does not resolve is not one."""
    loop = asyncio.get_running_loop()
    out: set[str] = set()
    for url in dict.fromkeys(urls):
        host = urlsplit(url).hostname
        if not host:
            continue
        try:
            infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError:
            continue
        if any(link_local(info[4][0]) for info in infos):
            out.add(url)
    return out


async def resolve_lanes(lanes: Sequence[Lane], allow_link_local: bool) -> None:
    """Each lane's address, or why it has none (every request to it then fails saying so)."""
    field = "base_url" if len(lanes) == 1 else "base_urls"
    for lane in lanes:
        try:
            lane.addr = await resolve(lane.target)
        except OSError as e:
            lane.resolve_error = f"cannot resolve {lane.target.host}: {e}"
            continue
        if not allow_link_local and link_local(lane.addr[1][0]):
            lane.resolve_error = (
                f"{field}: {lane.target.host} {REFUSED_LINK_LOCAL} (--allow-link-local-targets)"
            )
            lane.addr = None


def route_head(
    lane: Lane,
    route: Route,
    rid: str,
    spec: RunSpec,
    surface: Sequence[tuple[str, str]],
    key_header: str | None,
) -> bytes:
    """The request line and headers of request ``rid`` on ``route`` (``request_head``)."""
    extra: Mapping[str, str] = spec.headers
    if route.session is not None:
        extra = {**spec.headers, spec.session_header: route.session}
    headers = request_headers(
        lane.target, rid, spec.api_key, keep_alive=spec.connection_mode == "keep-alive",
        extra=extra, stream=spec.stream, surface=surface, key_header=key_header,
    )  # fmt: skip
    return request_head(lane.path, headers)
