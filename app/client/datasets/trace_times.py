"""What the timed dataset types (``mooncake``, ``timed_jsonl``) share: a line's timestamp,
how many lines a run replays, and the send schedule of the replayed ones.

* A ``timestamp`` is ms from the trace's start: a JSON number (not a bool; NaN and infinity
  are refused when the line is read), >= 0, at most ``MAX_TIMESTAMP_MS`` (1e13 ms, the
  year 2286 as Unix ms: a trace stamped with absolute times passes), never below the
  previous line's.
* ``num_prompts`` not given (None): every line is replayed, at most ``MAX_NUM_PROMPTS``;
  given: the first ``num_prompts`` lines, and a shorter trace is refused (never cycled).
* The replayed lines' schedule, ``(t_k - t_0) / speedup``, spans at most ``MAX_REPLAY_MS``
  (365 days): a longer one is refused naming the first line past it (timestamps in seconds
  or ns read as ms, or a speedup far below 1), so every send time fits an int64 of ns.
"""

from __future__ import annotations

from typing import Any

from app.client.datasets.base import MAX_NUM_PROMPTS

MAX_TIMESTAMP_MS = 1e13
MAX_REPLAY_MS = 365 * 86_400_000
NS_PER_MS = 1_000_000


def _shown(v: float) -> str:
    return f"{v:g}"


def timestamp_of(obj: dict[str, Any], where: str, previous: float | None) -> float:
    """A line's ``timestamp`` (ms): a number in [0, ``MAX_TIMESTAMP_MS``], never below the
    previous one; else a ``ValueError`` naming the line and field."""
    ts = obj.get("timestamp")
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        raise ValueError(f"{where}: 'timestamp' must be a number of ms")
    if ts != ts or ts in (float("inf"), float("-inf")):
        raise ValueError(f"{where}: 'timestamp' must be a finite number of ms")
    if ts < 0:
        raise ValueError(f"{where}: 'timestamp' must be >= 0, got {_shown(max(ts, -1e300))}")
    if ts > MAX_TIMESTAMP_MS:  # an int past a float's range compares exactly, unconverted
        raise ValueError(
            f"{where}: 'timestamp' is over {MAX_TIMESTAMP_MS:g} ms (ms from the trace's "
            "start, or Unix ms)"
        )
    value = float(ts)
    if previous is not None and value < previous:
        raise ValueError(
            f"{where}: 'timestamp' {_shown(value)} is earlier than the previous line's "
            f"{_shown(previous)} (a trace's timestamps must not decrease)"
        )
    return value


def replayed(n_lines: int, num_prompts: int | None, what: str) -> int:
    """How many of a trace's ``n_lines`` lines a run replays (``what``: "requests",
    "timed prompts", for the message)."""
    if num_prompts is None:
        if n_lines > MAX_NUM_PROMPTS:
            raise ValueError(
                f"num_prompts: the trace has {n_lines:,} {what}, more than a run replays "
                f"({MAX_NUM_PROMPTS:,}): give num_prompts"
            )
        return n_lines
    if n_lines < num_prompts:
        raise ValueError(
            f"num_prompts: {num_prompts} requested, the trace has {n_lines} {what} (give "
            f"num_prompts {n_lines} or fewer, or leave it out to replay the whole trace)"
        )
    return num_prompts


def schedule_ns(times_ms: list[float], linenos: list[int], speedup: float) -> list[int]:
    """Send times (ns from the first replayed line) of timestamps in ms divided by
    ``speedup``; a ``ValueError`` naming the first line whose send time is more than
    ``MAX_REPLAY_MS`` after the first."""
    if not times_ms:
        return []
    t0 = times_ms[0]
    for t, lineno in zip(times_ms, linenos, strict=True):
        if (t - t0) / speedup > MAX_REPLAY_MS:
            raise ValueError(
                f"dataset_path line {lineno}: 'timestamp' {_shown(t)} is {_shown(t - t0)} ms "
                f"after the first replayed line's: at speedup {_shown(speedup)} the replay "
                "would last over 365 days (timestamps are ms; give "
                "dataset_options.speedup or fewer num_prompts)"
            )
    return [round((t - t0) * NS_PER_MS / speedup) for t in times_ms]
