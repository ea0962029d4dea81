"""The operator's target allow-list: which servers runs may send load to.

``Settings.target_allowlist`` holds entries of three kinds; a run's ``base_url`` is allowed
when its host matches any entry (an empty list allows every target):

- a CIDR or a single IP (``10.0.0.0/8``, ``127.0.0.1``, ``fd00::/8``): matches IP-literal
  hosts inside it;
- a host name or glob pattern (``vllm.lab.example``, ``*.gpu.example``): matches the host
  name, case-insensitively (``*`` also spans dots);
- either of the above with ``:port`` (``vllm.lab.example:8000``, ``[::1]:9000``): the port
  must match too (the URL's explicit port, or 80/443 from its scheme).

Host names are matched as written and never resolved: a name that resolves into an allowed
network is still refused unless a pattern names it, so DNS cannot widen the list.

Whatever the list says, by default a run may not target this dashboard itself (its bind
address and public URL, and loopback at its port: a run would load, or read through its
errors, the dashboard's own API) nor link-local addresses (169.254.0.0/16, fe80::/10: cloud
metadata services), unless ``target_allow_self`` / ``target_allow_link_local`` say so. The
same checks apply to ``metrics_url``. Workers refuse a target *name* that resolves to a
link-local address (``app.client.runner``), which the server cannot see.
"""

from __future__ import annotations

import fnmatch
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from app.services.errors import Invalid
from app.settings import Settings

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class Rule:
    network: Network | None  # an IP rule
    pattern: str | None  # a host-name rule (lower case)
    port: int | None  # None: any port

    def matches(
        self, host: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None, port: int
    ) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.network is not None:
            return ip is not None and ip.version == self.network.version and ip in self.network
        return self.pattern is not None and fnmatch.fnmatchcase(host, self.pattern)


def _split_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):  # [v6]:port or [v6]
        host, _, rest = entry[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        if port.isdigit():
            return host, int(port)
    return entry, None


def parse_rule(entry: str) -> Rule:
    """One allow-list entry; ValueError names a malformed one."""
    text = entry.strip().lower().rstrip(".")
    if not text:
        raise ValueError("empty allow-list entry")
    host, port = _split_port(text)
    try:
        return Rule(ipaddress.ip_network(host, strict=False), None, port)
    except ValueError:
        pass
    if any(c in host for c in "/@ \t") or not host:
        raise ValueError(f"allow-list entry {entry!r} is neither a host pattern nor a CIDR")
    return Rule(None, host, port)


def parse_rules(entries: Sequence[str]) -> list[Rule]:
    return [parse_rule(e) for e in entries]


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def target_allowed(base_url: str, rules: Sequence[Rule]) -> bool:
    """Whether ``base_url`` may be targeted; every URL is allowed when ``rules`` is empty."""
    if not rules:
        return True
    try:
        parts = urlsplit(base_url.strip())
        port = parts.port
    except ValueError:
        return False
    host = (parts.hostname or "").lower().rstrip(".")
    if not host or parts.scheme not in ("http", "https"):
        return False
    port = port if port is not None else (443 if parts.scheme == "https" else 80)
    ip = _ip(host)
    if ip is not None and getattr(ip, "ipv4_mapped", None) is not None:
        ip = ip.ipv4_mapped  # type: ignore[union-attr]
    return any(r.matches(host, ip, port) for r in rules)


LINK_LOCAL: tuple[Network, ...] = (
    ipaddress.ip_network("169.254.0.0/16"),
    ipaddress.ip_network("fe80::/10"),
)
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_link_local(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip.version == n.version and ip in n for n in LINK_LOCAL)


def own_addresses(settings: Settings) -> list[Rule]:
    """Rules matching this dashboard: its bind host and public URL (with their ports), and
    loopback at its port (a bind on 0.0.0.0 / :: answers there too)."""
    rules = [Rule(None, name, settings.port) for name in LOOPBACK_NAMES]
    rules += [Rule(ipaddress.ip_network("127.0.0.0/8"), None, settings.port)]
    host = settings.host.strip("[]").lower()
    if host and host not in ("0.0.0.0", "::"):
        rules.append(
            parse_rule(f"[{host}]:{settings.port}" if ":" in host else f"{host}:{settings.port}")
        )
    if settings.public_url:
        try:
            u = urlsplit(settings.public_url)
            port = u.port or (443 if u.scheme == "https" else 80)
        except ValueError:
            u, port = None, 0
        if u is not None and u.hostname:
            h = u.hostname.lower()
            rules.append(parse_rule(f"[{h}]:{port}" if ":" in h else f"{h}:{port}"))
    return rules


def refusal(url: str, settings: Settings) -> str | None:
    """Why this dashboard refuses ``url`` as a target whatever its allow-list, or None."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return "is not a valid URL"
    host = (parts.hostname or "").lower().rstrip(".")
    port = port if port is not None else (443 if parts.scheme == "https" else 80)
    ip = _ip(host)
    if ip is not None and not settings.target_allow_link_local and is_link_local(ip):
        return "is a link-local address (e.g. a cloud metadata service)"
    if not settings.target_allow_self:
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        if any(r.matches(host, mapped or ip, port) for r in own_addresses(settings)):
            return "is this dashboard itself"
    return None


def check_target(
    base_url: str,
    allowlist: Sequence[str],
    *,
    field: str = "base_url",
    settings: Settings | None = None,
) -> None:
    """Raise ``Invalid`` (422, naming ``field``) when the operator's allow-list, or the
    dashboard's own refusals (``settings``), refuse the URL."""
    if settings is not None:
        why = refusal(base_url, settings)
        if why is not None:
            raise Invalid(
                f"{field} {base_url!r} {why}: runs may not target it (see "
                "docs/reliability.md: TOKENTRACE_TARGET_ALLOW_SELF / _LINK_LOCAL)",
                loc=("body", field),
            )
    rules = parse_rules(allowlist)
    if not target_allowed(base_url, rules):
        raise Invalid(
            f"{field} {base_url!r} is not in this server's target allow-list "
            f"({', '.join(allowlist)}); ask the operator to add it",
            loc=("body", field),
        )


def check_run_targets(
    base_url: str, metrics_url: str | None, settings: Settings, base_urls: Sequence[str] = ()
) -> None:
    """``base_url``, each of ``base_urls`` (a run of several targets) and ``metrics_url``
    (the scraper connects there too) pass the same checks."""
    check_target(base_url, settings.target_allowlist, settings=settings)
    for url in base_urls:
        check_target(url, settings.target_allowlist, field="base_urls", settings=settings)
    if metrics_url:
        check_target(metrics_url, settings.target_allowlist, field="metrics_url", settings=settings)
