"""Images in chat prompts: the content part a chat message carries
(``{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}``), from a file a
dataset line names (``read_image``: confined like ``dataset_path``, its type sniffed from its
magic bytes, its size bounded) or synthetic (``noise_png``: a seeded PNG of noise, written
with zlib alone: no imaging library needed).

The client's tokenizer counts a prompt's text only: an image's tokens are the server's to
count (``usage.prompt_tokens``); a run whose server gives none says so (a run note).
"""

from __future__ import annotations

import base64
import os
import struct
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from app.client.datasets.base import REFUSED, _open_confined

MAX_IMAGE_BYTES = 20 << 20  # one image file, as read (OpenAI's limit per image)
MAX_IMAGES_PER_LINE = 32
MAX_IMAGE_SIDE = 4096  # a synthetic image's width and height, at most
NOISE_CELL = 8  # a synthetic image's noise is drawn per cell of this many pixels square
# file types a chat image may be, by their first bytes
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def sniff(data: bytes) -> str | None:
    """The image's MIME type from its magic bytes (PNG, JPEG, GIF, WebP), else None."""
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


def image_part(url: str) -> dict[str, Any]:
    """A chat content part carrying the image at ``url``."""
    return {"type": "image_url", "image_url": {"url": url}}


def read_image(name: object, where: str, base_dir: str, dirs: Sequence[str] | None) -> str:
    """The image file ``name`` (relative to ``base_dir``, the dataset file's directory) as a
    data URL. ``dirs`` confines it as ``open_dataset`` confines ``dataset_path`` (a regular
    file inside the worker's dataset directories; every refusal reads the same); it must be
    an image by its magic bytes and at most ``MAX_IMAGE_BYTES``. Errors start with ``where``
    (``dataset_path line 3: 'images'[0]``)."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ValueError(f"{where}: must be a non-empty file name")
    path = os.path.join(base_dir, name)
    try:
        with _open_confined(path, dirs, binary=True) as f:
            data: bytes = f.read(MAX_IMAGE_BYTES + 1)
    except ValueError as e:
        if str(e) == REFUSED:
            raise ValueError(
                f"{where}: not an image file this worker may read (a regular file inside its "
                "dataset directories: TOKENTRACE_DATASET_DIRS or --dataset-dir)"
            ) from None
        reason = str(e).split(": ", 1)[-1]
        raise ValueError(f"{where}: {reason}") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise ValueError(f"{where}: the image is over {MAX_IMAGE_BYTES:,} bytes")
    mime = sniff(data)
    if mime is None:
        raise ValueError(f"{where}: not an image (PNG, JPEG, GIF or WebP, by its first bytes)")
    return data_url(data, mime)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png(width: int, height: int, raw: bytes) -> bytes:
    """An 8-bit RGB PNG of the filtered scanlines ``raw``."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    # run-length deflate: the filtered scanlines are mostly runs of zeros (3x faster than
    # the default strategy here, and smaller)
    z = zlib.compressobj(6, zlib.DEFLATED, 15, 9, zlib.Z_RLE)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", ihdr)
        + _chunk(b"IDAT", z.compress(raw) + z.flush())
        + _chunk(b"IEND", b"")
    )


def noise_png(width: int, height: int, rng: np.random.Generator) -> bytes:
    """A seeded ``width`` x ``height`` PNG of random colours, one per ``NOISE_CELL``-pixel
    square cell: every image is distinct (a server's image cache never serves one from
    another), its bytes about 3 per cell (a thousand 512x512 images hold ~25 MB).

    The first scanline of a row of cells is filtered "Sub" (each byte minus the one 3 to its
    left: zero inside a cell), the others "Up" (minus the byte above: all zero)."""
    cells_y, cells_x = -(-height // NOISE_CELL), -(-width // NOISE_CELL)
    cells = rng.integers(0, 256, size=(cells_y, cells_x, 3), dtype=np.uint8)
    line = np.repeat(cells, NOISE_CELL, axis=1)[:, :width].reshape(cells_y, width * 3)
    sub = line.astype(np.int16)
    sub[:, 3:] -= line[:, :-3]
    raw = np.zeros((height, width * 3 + 1), np.uint8)
    raw[:, 0] = 2  # Up
    raw[::NOISE_CELL, 0] = 1  # Sub
    raw[::NOISE_CELL, 1:] = (sub & 0xFF).astype(np.uint8)
    return _png(width, height, raw.tobytes())


def noise_png_bytes_bound(width: int, height: int) -> int:
    """A bound on ``noise_png``'s size: its cells' raw bytes and deflate's overhead."""
    cells = -(-height // NOISE_CELL) * -(-width // NOISE_CELL) * 3
    return 2 * cells + height * (width * 3 + 1) // 64 + 1024
