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
"""

from __future__ import annotations

import fnmatch
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from app.services.errors import Invalid

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


def check_target(base_url: str, allowlist: Sequence[str]) -> None:
    """Raise ``Invalid`` (422, naming ``base_url``) when the operator's allow-list refuses
    ``base_url``."""
    rules = parse_rules(allowlist)
    if not target_allowed(base_url, rules):
        raise Invalid(
            f"base_url {base_url!r} is not in this server's target allow-list "
            f"({', '.join(allowlist)}); ask the operator to add it",
            loc=("body", "base_url"),
        )
