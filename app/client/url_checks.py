"""Checks of a run's URLs and keys (``RunSpec``'s ``base_url``, ``metrics_url``,
``api_key``; alert webhooks), and a URL's credentials scrubbed before it is stored."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

MAX_URL_CHARS = 2048
MAX_API_KEY_CHARS = 8192


def checked_url(field: str, v: str) -> str:
    """``v`` if it is an http(s) URL with a host, no credentials and no control or space
    characters (a CR/LF would split the request line or a header); else a ValueError
    naming ``field``."""
    if len(v) > MAX_URL_CHARS:
        raise ValueError(f"{field}: at most {MAX_URL_CHARS} characters")
    bad = next((c for c in v if c.isspace() or not c.isprintable()), None)
    if bad is not None:
        raise ValueError(
            f"{field}: contains the character U+{ord(bad):04X}; control and space characters "
            "(CR, LF, NUL, tab ...) are refused"
        )
    if not (v.startswith("http://") or v.startswith("https://")):
        raise ValueError(f"{field} must start with http:// or https://")
    parts = urlsplit(v)
    if "@" in parts.netloc:
        raise ValueError(
            f"{field}: credentials in the URL (user:password@host) are refused: the URL is "
            "stored and listed with the run; give the key as api_key or api_key_env"
        )
    try:
        parts.port  # noqa: B018 -- raises on a port that is not a number in 0..65535
    except ValueError:
        raise ValueError(f"{field}: the port is not a number from 0 to 65535") from None
    if not parts.hostname:
        raise ValueError(f"{field}: the URL has no host")
    return v


_URL_CREDENTIALS = re.compile(r"(?<=://)[^/?#]*@")  # user:password@ of a URL's authority


def without_credentials(url: str) -> str:
    """``url`` less any ``user:password@`` (for a URL from elsewhere, e.g. an imported
    file, that is stored and listed)."""
    return _URL_CREDENTIALS.sub("", url, count=1)


def check_api_key(field: str, v: str) -> None:
    """A ValueError naming ``field`` (never the key) unless ``v`` can go in an
    ``Authorization: Bearer`` header as it is: visible ASCII, no space or control character."""
    if len(v) > MAX_API_KEY_CHARS or not all("!" <= c <= "~" for c in v):
        raise ValueError(
            f"{field}: a key must be visible ASCII characters (no space, CR, LF, NUL or other "
            f"control character), at most {MAX_API_KEY_CHARS}"
        )
