"""A worker's clock offset to the server, from four-timestamp exchanges (NTP's on-wire
method), for runs dealt over several workers (issue 26 part 2; pure: no I/O).

One exchange: the worker stamps its request's send ``t1`` (its clock), the server its
receipt ``t2`` and its reply's send ``t3`` (the server's clock), the worker the reply's
receipt ``t4``. Then

* round trip ``rtt = (t4 - t1) - (t3 - t2)``: the time on the wire, the server's work apart;
* offset ``((t2 - t1) + (t3 - t4)) / 2``: server clock minus worker clock, exact when the two
  directions took equally long;
* bound ``rtt / 2``: whatever the asymmetry, the true offset lies within ``offset +- rtt/2``
  (each direction took between 0 and ``rtt``).

``OffsetTracker`` keeps, of the last ``window`` exchanges, the one with the smallest round
trip (the tightest bound; NTP's clock filter), and maps worker stamps onto the server's
axis. An exchange with a negative round trip (a clock stepped meanwhile) is refused. A bound
above ``MAX_BOUND_NS`` (5 ms) flags the worker's times in a dealt run.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

MAX_BOUND_NS = 5_000_000
WINDOW = 64


@dataclass(frozen=True, slots=True)
class Exchange:
    t1_ns: int  # worker: request sent
    t2_ns: int  # server: request received
    t3_ns: int  # server: reply sent
    t4_ns: int  # worker: reply received

    @property
    def rtt_ns(self) -> int:
        return (self.t4_ns - self.t1_ns) - (self.t3_ns - self.t2_ns)

    @property
    def offset_ns(self) -> int:
        """Server minus worker (rounded toward minus infinity to whole ns)."""
        return ((self.t2_ns - self.t1_ns) + (self.t3_ns - self.t4_ns)) // 2

    @property
    def bound_ns(self) -> int:
        """Half the round trip, rounded up: the offset's error bound."""
        return (self.rtt_ns + 1) // 2


@dataclass(frozen=True, slots=True)
class OffsetEstimate:
    offset_ns: int
    bound_ns: int
    rtt_ns: int
    samples: int  # exchanges seen (refused ones apart)

    @property
    def flagged(self) -> bool:
        """The bound is too wide for a run's times to be trusted to the millisecond."""
        return self.bound_ns > MAX_BOUND_NS

    def as_dict(self) -> dict[str, object]:
        return {
            "offset_ns": self.offset_ns,
            "bound_ns": self.bound_ns,
            "rtt_ns": self.rtt_ns,
            "samples": self.samples,
            "flagged": self.flagged,
        }


class OffsetTracker:
    """The best exchange of the last ``window`` (smallest round trip; the latest on a tie)."""

    def __init__(self, window: int = WINDOW) -> None:
        if window < 1:
            raise ValueError("window: at least 1 exchange")
        self._recent: deque[Exchange] = deque(maxlen=window)
        self.samples = 0
        self.refused = 0

    def add(self, ex: Exchange) -> bool:
        """Take one exchange; False (refused) when its round trip or the server's time
        between receipt and reply is negative: a clock stepped meanwhile."""
        if ex.rtt_ns < 0 or ex.t3_ns < ex.t2_ns:
            self.refused += 1
            return False
        self._recent.append(ex)
        self.samples += 1
        return True

    def estimate(self) -> OffsetEstimate | None:
        if not self._recent:
            return None
        best = min(reversed(self._recent), key=lambda e: e.rtt_ns)
        return OffsetEstimate(best.offset_ns, best.bound_ns, best.rtt_ns, self.samples)

    def to_server(self, t_ns: int) -> int:
        """A worker stamp on the server's clock (the estimate's offset applied)."""
        est = self.estimate()
        if est is None:
            raise ValueError("no exchange yet: the offset is unknown")
        return t_ns + est.offset_ns
