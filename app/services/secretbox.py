"""Target API keys at rest: sealed (Fernet: AES-128-CBC + HMAC-SHA256) in job specs.

A run submitted with ``api_key`` keeps it in its queued job's spec only as ``api_key_enc``;
the server opens it when a worker leases the job, so the plain key travels only inside a
lease answer (over the worker's connection) and lives only in the worker's memory (its
spool does not keep it). The key comes from ``TOKENTRACE_SECRET_KEY`` (a Fernet key) or, by
default, a key file created once with mode 0600 (``TOKENTRACE_SECRET_KEY_FILE``, default in
the user data directory). A run can instead name a variable the worker holds
(``api_key_env``): then the key never reaches the server at all.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet, InvalidToken

from app.settings import Settings

SEALED = "api_key_enc"


class SecretBox:
    def __init__(self, key: bytes) -> None:
        self._fernet = Fernet(key)

    @classmethod
    def from_settings(cls, settings: Settings) -> SecretBox:
        if settings.secret_key:
            return cls(settings.secret_key.encode("ascii"))
        return cls(_key_from_file(settings.secret_key_path()))

    def seal(self, text: str) -> str:
        return self._fernet.encrypt(text.encode("utf-8")).decode("ascii")

    def open(self, token: str) -> str:
        """The plain text; ValueError when it was sealed with another key or altered."""
        try:
            return self._fernet.decrypt(token.encode("ascii")).decode("utf-8")
        except (InvalidToken, UnicodeError) as e:
            raise ValueError("the sealed API key cannot be opened with this server's key") from e

    def seal_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        """A job spec with its ``api_key`` sealed (a copy; unchanged without one)."""
        out = dict(spec)
        key = out.pop("api_key", None)
        if key:
            out[SEALED] = self.seal(str(key))
        return out

    def open_spec(self, spec: dict[str, Any]) -> dict[str, Any]:
        """A job spec with its sealed key opened into ``api_key`` (for a lease)."""
        out = dict(spec)
        token = out.pop(SEALED, None)
        if token:
            out["api_key"] = self.open(str(token))
        return out


def _key_from_file(path: Path) -> bytes:
    """The key in ``path``, created (mode 0600, exclusively) on first use."""
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    key = Fernet.generate_key()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first
        return path.read_bytes().strip()
    with os.fdopen(fd, "wb") as f:
        f.write(key + b"\n")
    return key
