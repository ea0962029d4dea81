"""Where a target API key held by this machine may be sent.

A run names a key by ``api_key_env: TOKENTRACE_TARGET_KEY_<NAME>``; the machine that runs
the load (a worker, or the CLI's own ``tokentrace bench``) holds it, and binds it to the
targets it may go to in ``TOKENTRACE_TARGET_KEY_<NAME>_TARGETS``, comma-separated:

- a URL prefix, ``https://api.example.com/v1``: the same scheme, host and port (the
  scheme's default when none is written), and a path at or under that path;
- ``host:port``, ``10.0.0.5:8000`` or ``[::1]:8000``: that host and port, any scheme and
  path.

Hosts are compared as written (lower case, no DNS): ``localhost`` does not cover
``127.0.0.1``. A key with no binding, or a run whose ``base_url`` its binding does not
cover (any of its ``base_urls``, for a run of several targets), is refused before anything
is sent (``resolve_api_key``'s ValueError names the key
and the target, never the key's value). The key then goes with each request to ``base_url``
and its ``GET /v1/models`` (under ``base_url``), and to the ``/metrics`` scrape only where
the binding covers that URL too (``key_may_reach``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from app.client.spec import TARGETS_SUFFIX, RunSpec
from app.client.url_checks import check_api_key

DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_RULES = 256


@dataclass(frozen=True, slots=True)
class Rule:
    """One entry of a binding: ``scheme``/``path`` None for a ``host:port`` entry."""

    host: str
    port: int
    scheme: str | None = None
    path: str | None = None

    def covers(self, url: str) -> bool:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS or not parts.hostname:
            return False
        try:
            port = parts.port or DEFAULT_PORTS[scheme]
        except ValueError:
            return False
        if parts.hostname.lower() != self.host or port != self.port:
            return False
        if self.scheme is not None and scheme != self.scheme:
            return False
        if self.path:
            path = parts.path or "/"
            return path == self.path or path.startswith(self.path + "/")
        return True


def parse_rule(var: str, entry: str) -> Rule:
    """One binding entry; a ValueError naming ``var`` and the entry when it is neither form."""
    bad = ValueError(
        f"{var}: {entry!r} is not a target: give a URL prefix (https://host[:port][/path]) "
        "or host:port"
    )
    if "://" in entry:
        parts = urlsplit(entry)
        scheme = parts.scheme.lower()
        if scheme not in DEFAULT_PORTS or not parts.hostname or "@" in parts.netloc:
            raise bad
        if parts.query or parts.fragment:
            raise bad
        try:
            port = parts.port or DEFAULT_PORTS[scheme]
        except ValueError:
            raise bad from None
        path = parts.path.rstrip("/")
        return Rule(parts.hostname.lower(), port, scheme, path or None)
    parts = urlsplit("//" + entry)
    try:
        given = parts.port
    except ValueError:
        raise bad from None
    if given is None or not parts.hostname or parts.path or "@" in parts.netloc:
        raise bad
    return Rule(parts.hostname.lower(), given)


def parse_binding(var: str, text: str) -> tuple[Rule, ...]:
    """The rules of a ``..._TARGETS`` value (comma-separated entries, blanks ignored)."""
    entries = [e.strip() for e in text.split(",") if e.strip()]
    if len(entries) > MAX_RULES:
        raise ValueError(f"{var}: at most {MAX_RULES} targets")
    return tuple(parse_rule(var, e) for e in entries)


def binding_var(key_var: str) -> str:
    return key_var + TARGETS_SUFFIX


def _binding(key_var: str, env: Mapping[str, str]) -> tuple[Rule, ...]:
    var = binding_var(key_var)
    rules = parse_binding(var, env.get(var, ""))
    if not rules:
        raise ValueError(
            f"api_key_env: {key_var} is not bound to any target on the machine that runs the "
            f"load: set {var} there to the targets it may be sent to (URL prefixes or "
            "host:port, comma-separated); nothing was sent"
        )
    return rules


def resolve_api_key(spec: RunSpec, env: Mapping[str, str] | None = None) -> RunSpec:
    """``spec`` with ``api_key`` read from ``api_key_env`` here, when its binding covers
    every base URL of the run (``spec.targets()``); else a ValueError naming the first it
    does not (nothing has been sent). ``env``: os.environ."""
    name = spec.api_key_env
    if not name:
        return spec
    env = os.environ if env is None else env
    key = env.get(name)
    if not key:
        raise ValueError(f"api_key_env: {name} is not set where the load runs")
    check_api_key(f"api_key_env: {name}", key)
    rules = _binding(name, env)
    for url in spec.targets():  # a run of several targets: its key goes to each of them
        if not any(rule.covers(url) for rule in rules):
            raise ValueError(
                f"api_key_env: {name} may not be sent to {url}: {binding_var(name)} on "
                "the machine that runs the load does not list that target; nothing was sent"
            )
    return spec.model_copy(update={"api_key": key})


def key_may_reach(spec: RunSpec, url: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether ``spec``'s key may go to ``url``: a key given in the run (``api_key``) goes to
    the run's own target; one read here (``api_key_env``) only where its binding covers."""
    if not spec.api_key_env:
        return True
    env = os.environ if env is None else env
    try:
        rules = _binding(spec.api_key_env, env)
    except ValueError:
        return False
    return any(rule.covers(url) for rule in rules)
