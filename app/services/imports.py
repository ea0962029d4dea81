"""The import size limit and reading an import file as text (the importers: ``file_imports``)."""

from __future__ import annotations

from pathlib import Path

from app.importers.csv_log import ImportFormatError
from app.settings import get_settings


def import_limit() -> int:
    """The largest import file, in bytes: ``Settings.max_import_bytes``, the one limit the
    CLI, the API and the import page all apply."""
    return get_settings().max_import_bytes


def import_events_limit() -> int:
    """The most events (token chunk times) one import may hold: ``Settings.max_import_events``,
    for the CLI, the API and the import page alike."""
    return get_settings().max_import_events


def check_import_size(path: Path, max_bytes: int | None = None) -> None:
    """``ImportFormatError`` when the file is over ``max_bytes`` (default ``import_limit()``)."""
    limit = import_limit() if max_bytes is None else max_bytes
    size = path.stat().st_size
    if size > limit:
        raise ImportFormatError(
            f"{path.name}: {size} bytes is larger than the {limit}-byte import limit "
            "(TOKENTRACE_MAX_IMPORT_BYTES)"
        )


def read_import_text(path: Path, max_bytes: int | None = None) -> str:
    """The file as UTF-8 text; ``ImportFormatError`` when it is over ``max_bytes`` (default
    ``import_limit()``) or not UTF-8."""
    check_import_size(path, max_bytes)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ImportFormatError(f"{path.name}: not UTF-8 text (byte {e.start})") from None
