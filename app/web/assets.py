"""Static files under content-hashed URLs: ``/static/plotly.min.<hash>.js`` is served with a
year-long immutable ``Cache-Control`` (a browser fetches plotly.js once per version), the
plain ``/static/plotly.min.js`` with ``no-cache`` (revalidated by ETag), a wrong hash 404s.

The hashes are computed once, when the app is created (``app.state.static_assets``);
templates link files with ``static_url('plotly.min.js')`` (a Jinja global reading it)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from jinja2 import pass_context
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

PREFIX = "/static"
HASH_LEN = 12  # hex digits of the file's SHA-256
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"


def hashed_name(name: str, digest: str) -> str:
    """``plotly.min.js`` + digest -> ``plotly.min.<digest>.js`` (before the last suffix)."""
    stem, dot, ext = name.rpartition(".")
    return f"{stem}.{digest}.{ext}" if dot and stem else f"{name}.{digest}"


@dataclass(frozen=True, slots=True)
class StaticAssets:
    """The files of one static directory (its top level), each with its content hash."""

    directory: Path
    digests: Mapping[str, str]  # file name -> hash
    by_hashed: Mapping[str, str]  # hashed name -> file name

    @classmethod
    def scan(cls, directory: Path) -> StaticAssets:
        digests: dict[str, str] = {}
        for path in sorted(directory.iterdir()):
            if path.is_file() and not path.name.startswith("."):
                digests[path.name] = _digest(path)
        by_hashed = {hashed_name(n, d): n for n, d in digests.items()}
        return cls(directory, MappingProxyType(digests), MappingProxyType(by_hashed))

    def url(self, name: str) -> str:
        """The hashed URL of ``name``; a name that is not a static file is an error (a
        template typo fails the page test instead of linking a 404)."""
        digest = self.digests.get(name)
        if digest is None:
            raise KeyError(f"no static file {name!r} in {self.directory}")
        return f"{PREFIX}/{hashed_name(name, digest)}"


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:HASH_LEN]


class HashedStaticFiles(StaticFiles):
    """``StaticFiles`` restricted to the scanned files: a hashed name gets the immutable
    cache header, a plain name ``no-cache``, anything else (a stale or wrong hash, a
    sub-path) 404s."""

    def __init__(self, assets: StaticAssets) -> None:
        super().__init__(directory=str(assets.directory))
        self.assets = assets

    async def get_response(self, path: str, scope: Scope) -> Response:
        name = self.assets.by_hashed.get(path)
        cache = IMMUTABLE
        if name is None and path in self.assets.digests:
            name, cache = path, REVALIDATE
        if name is None:
            raise HTTPException(404, f"no static file {path!r}")
        resp = await super().get_response(name, scope)
        resp.headers["Cache-Control"] = cache
        return resp


def assets_of(app: Any) -> StaticAssets:
    assets = getattr(app.state, "static_assets", None)
    if not isinstance(assets, StaticAssets):
        raise RuntimeError("app.state.static_assets is not set (app.web.mount does it)")
    return assets


@pass_context
def static_url(ctx: Any, name: str) -> str:
    """Jinja global: the hashed URL of a static file, from the request's app."""
    return assets_of(ctx["request"].app).url(name)
