"""Compact, lossless binary encoding of one request's event log (numpy only, no per-event Python).

Layout (all little-endian)::

    header (16 bytes): magic b"TE" | version u8 | flags u8 | count u32 | t0 i64
    times : (count-1) x u32 gaps after t0          or, flag T_ABS,   count x i64 absolute
    bytes : count x u16                            or, flag BYTES32, count x i32
    tokens: count x u16                            or, flag TOK32,   count x i32
                                                   or, flag TOK_CONST, 1 x (u16 | i32)
    kinds : count x i8                             or, flag KIND_CONST, 1 x i8

``t0`` is the first event time (0 for an empty log). Gaps use uint32 when every gap is in
``[0, 2**32)``; otherwise times are stored absolute. The constant flags shrink the common case
(every chunk carried one content token) to a single value. Decoding uses ``np.cumsum`` with
int64 wrap-around, which is exact modulo 2**64, so every int64 input round-trips.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
I8 = npt.NDArray[np.int8]

MAGIC = b"TE"
VERSION = 1
HEADER = struct.Struct("<2sBBIq")
HEADER_SIZE = HEADER.size  # 16

T_ABS = 0x01
BYTES32 = 0x02
TOK32 = 0x04
TOK_CONST = 0x08
KIND_CONST = 0x10
_KNOWN_FLAGS = T_ABS | BYTES32 | TOK32 | TOK_CONST | KIND_CONST

_U16_MAX = 0xFFFF
_U32_LIMIT = 1 << 32
_MAX_COUNT = 0xFFFFFFFF

_LE_I64 = np.dtype("<i8")
_LE_U32 = np.dtype("<u4")
_LE_I32 = np.dtype("<i4")
_LE_U16 = np.dtype("<u2")
_I8 = np.dtype("i1")


@dataclass(frozen=True, slots=True)
class EventArrays:
    """Decoded event columns of one or many requests (``offsets`` delimit requests)."""

    t_ns: I64
    nbytes: I32
    kind: I8
    tokens: I32


def _as_1d(name: str, a: object, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    arr = np.asarray(a)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must have an integer dtype, got {arr.dtype}")
    if arr.dtype != dtype:
        if arr.size and (
            int(arr.min()) < np.iinfo(dtype).min or int(arr.max()) > np.iinfo(dtype).max
        ):
            raise ValueError(f"{name} has values outside the {dtype} range")
        arr = arr.astype(dtype)
    return arr


def pack_events(
    t_ns: npt.ArrayLike,
    nbytes: npt.ArrayLike,
    kind: npt.ArrayLike,
    tokens: npt.ArrayLike,
) -> bytes:
    """Encode four parallel event columns (int64 ns, int32 bytes, int8 kind, int32 tokens)."""
    t = _as_1d("t_ns", t_ns, _LE_I64)
    b = _as_1d("nbytes", nbytes, _LE_I32)
    k = _as_1d("kind", kind, _I8)
    tk = _as_1d("tokens", tokens, _LE_I32)
    n = t.shape[0]
    if not (b.shape[0] == n and k.shape[0] == n and tk.shape[0] == n):
        raise ValueError(
            f"event arrays differ in length: t_ns {n}, nbytes {b.shape[0]}, "
            f"kind {k.shape[0]}, tokens {tk.shape[0]}"
        )
    if n > _MAX_COUNT:
        raise ValueError(f"too many events for one request: {n}")
    if n == 0:
        return HEADER.pack(MAGIC, VERSION, 0, 0, 0)

    flags = 0
    parts: list[bytes] = [b""]
    if n > 1:
        gaps = np.diff(t)
        if int(gaps.min()) < 0 or int(gaps.max()) >= _U32_LIMIT:
            flags |= T_ABS
            parts.append(t.astype(_LE_I64, copy=False).tobytes())
        else:
            parts.append(gaps.astype(_LE_U32).tobytes())

    if int(b.min()) >= 0 and int(b.max()) <= _U16_MAX:
        parts.append(b.astype(_LE_U16).tobytes())
    else:
        flags |= BYTES32
        parts.append(b.astype(_LE_I32, copy=False).tobytes())

    tmin, tmax = int(tk.min()), int(tk.max())
    tok_dtype = _LE_U16 if tmin >= 0 and tmax <= _U16_MAX else _LE_I32
    if tok_dtype is _LE_I32:
        flags |= TOK32
    if tmin == tmax:
        flags |= TOK_CONST
        parts.append(tk[:1].astype(tok_dtype).tobytes())
    else:
        parts.append(tk.astype(tok_dtype).tobytes())

    k0 = k[0]
    if (k == k0).all():
        flags |= KIND_CONST
        parts.append(k[:1].tobytes())
    else:
        parts.append(k.tobytes())

    parts[0] = HEADER.pack(MAGIC, VERSION, flags, n, int(t[0]))
    return b"".join(parts)


def _layout(flags: int, n: int) -> tuple[int, int, int, int]:
    """Byte sizes of the times, bytes, tokens and kinds sections."""
    if n == 0:
        return 0, 0, 0, 0
    t_size = 8 * n if flags & T_ABS else 4 * (n - 1)
    b_size = (4 if flags & BYTES32 else 2) * n
    tok_w = 4 if flags & TOK32 else 2
    tok_size = tok_w if flags & TOK_CONST else tok_w * n
    k_size = 1 if flags & KIND_CONST else n
    return t_size, b_size, tok_size, k_size


def _where(index: int | None) -> str:
    return "" if index is None else f" #{index}"


def _header(blob: bytes | memoryview, index: int | None) -> tuple[int, int, int]:
    if len(blob) < HEADER_SIZE:
        where = _where(index)
        raise ValueError(f"event blob{where} is too short: {len(blob)} bytes, header needs 16")
    magic, version, flags, n, t0 = HEADER.unpack_from(blob)
    if magic != MAGIC:
        where = _where(index)
        raise ValueError(f"event blob{where} has a bad magic {magic!r} (expected {MAGIC!r})")
    if version != VERSION:
        raise ValueError(f"event blob{_where(index)} has unsupported version {version}")
    if flags & ~_KNOWN_FLAGS:
        raise ValueError(f"event blob{_where(index)} has unknown flags 0x{flags:02x}")
    t_size, b_size, tok_size, k_size = _layout(flags, n)
    expected = HEADER_SIZE + t_size + b_size + tok_size + k_size
    if len(blob) != expected:
        raise ValueError(
            f"event blob{_where(index)} is corrupt: {len(blob)} bytes for {n} events "
            f"with flags 0x{flags:02x}, expected {expected}"
        )
    return flags, n, t0


def _decode_into(
    blob: bytes | memoryview,
    flags: int,
    n: int,
    t0: int,
    t_out: I64,
    b_out: I32 | None,
    k_out: I8,
    tok_out: I32,
    *,
    cumsum_times: bool,
) -> None:
    """Write one blob's columns into the given (length-n) output views.

    With ``cumsum_times=False`` narrow gap times are left as [t0, gap1, gap2, ...] so a caller
    can run one cumulative sum over many requests.
    """
    if n == 0:
        return
    t_size, b_size, tok_size, _ = _layout(flags, n)
    off = HEADER_SIZE
    if flags & T_ABS:
        t_out[:] = np.frombuffer(blob, _LE_I64, n, off)
    else:
        t_out[0] = t0
        t_out[1:] = np.frombuffer(blob, _LE_U32, n - 1, off)
        if cumsum_times:
            np.cumsum(t_out, out=t_out)
    off += t_size
    if b_out is not None:
        b_out[:] = np.frombuffer(blob, _LE_I32 if flags & BYTES32 else _LE_U16, n, off)
    off += b_size
    tok_dtype = _LE_I32 if flags & TOK32 else _LE_U16
    tok_out[:] = np.frombuffer(blob, tok_dtype, 1 if flags & TOK_CONST else n, off)
    off += tok_size
    k_out[:] = np.frombuffer(blob, _I8, 1 if flags & KIND_CONST else n, off)


def event_count(blob: bytes | memoryview) -> int:
    """Number of events in a blob (validates the header and the length)."""
    return _header(blob, None)[1]


def unpack_events(blob: bytes | memoryview) -> tuple[I64, I32, I8, I32]:
    """Decode one blob into (t_ns int64, nbytes int32, kind int8, tokens int32)."""
    flags, n, t0 = _header(blob, None)
    t = np.empty(n, np.int64)
    b = np.empty(n, np.int32)
    k = np.empty(n, np.int8)
    tok = np.empty(n, np.int32)
    _decode_into(blob, flags, n, t0, t, b, k, tok, cumsum_times=True)
    return t, b, k, tok


def unpack_many(
    blobs: Sequence[bytes | memoryview | None],
    *,
    with_nbytes: bool = True,
) -> tuple[I64, EventArrays]:
    """Decode many blobs into one concatenated set of columns.

    Returns ``(offsets, arrays)``: events of blob i are ``arrays.*[offsets[i]:offsets[i+1]]``.
    ``None`` counts as an empty log. Times of narrow-gap blobs are reconstructed with a
    single cumulative sum over all blobs. ``with_nbytes=False`` skips the byte-length column
    (left as zeros) for callers that do not need it.
    """
    m = len(blobs)
    headers: list[tuple[int, int, int]] = []
    for i, blob in enumerate(blobs):
        if blob is None:
            headers.append((0, 0, 0))
            continue
        headers.append(_header(blob, i))
    counts = np.fromiter((h[1] for h in headers), np.int64, m)
    offsets = np.zeros(m + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    total = int(offsets[-1])

    t = np.empty(total, np.int64)
    b = np.zeros(total, np.int32) if not with_nbytes else np.empty(total, np.int32)
    k = np.empty(total, np.int8)
    tok = np.empty(total, np.int32)
    absolute: list[int] = []
    offs = offsets.tolist()
    for i, blob in enumerate(blobs):
        flags, n, t0 = headers[i]
        if n == 0 or blob is None:
            continue
        lo, hi = offs[i], offs[i + 1]
        if flags & T_ABS:
            absolute.append(i)
        _decode_into(
            blob,
            flags,
            n,
            t0,
            t[lo:hi],
            b[lo:hi] if with_nbytes else None,
            k[lo:hi],
            tok[lo:hi],
            cumsum_times=False,
        )

    if total:
        _chain_times(t, offsets, counts, absolute)
    return offsets, EventArrays(t_ns=t, nbytes=b, kind=k, tokens=tok)


def _chain_times(t: I64, offsets: I64, counts: I64, absolute: list[int]) -> None:
    """Turn [t0, gap, gap, ...] segments into times with one cumulative sum over all blobs.

    Each narrow blob's first slot becomes ``t0 - (last time of the previous narrow blob)`` so
    the running sum restarts at ``t0``; absolute-time segments are zeroed during the sum (the
    running total passes through them unchanged) and restored afterwards. int64 wrap-around
    is exact modulo 2**64, so extreme values round-trip too.
    """
    saved = [(int(offsets[i]), t[offsets[i] : offsets[i + 1]].copy()) for i in absolute]
    for lo, seg in saved:
        t[lo : lo + seg.shape[0]] = 0
    narrow = counts > 0
    if absolute:
        narrow[absolute] = False
    starts = offsets[:-1][narrow]
    if starts.shape[0]:
        with np.errstate(over="ignore"):
            first = t[starts]
            last = np.add.reduceat(t, starts)  # t0 + sum of gaps (+ zeroed absolute runs)
            t[starts[1:]] = first[1:] - last[:-1]
            np.cumsum(t, out=t)
    for lo, seg in saved:
        t[lo : lo + seg.shape[0]] = seg
