"""A worker's clock offset to the server by four-timestamp exchanges (issue 26 part 2),
by hand: the offset, its bound, the smallest round trip kept, a stepped clock refused."""

from __future__ import annotations

import pytest

from app.protocol.clock_sync import MAX_BOUND_NS, Exchange, OffsetTracker

MS = 1_000_000


def _ex(offset: int, out_ns: int, back_ns: int, t1: int = 1_000 * MS, work: int = MS) -> Exchange:
    """An exchange with a true offset (server - worker) and one-way delays, built forward."""
    t2 = t1 + out_ns + offset
    t3 = t2 + work
    t4 = t3 - offset + back_ns
    return Exchange(t1, t2, t3, t4)


def test_one_exchange_by_hand() -> None:
    # worker sends at 100, server (clock +50 ahead) receives at 100+3+50=153, replies at
    # 154, worker receives at 154-50+7=111: rtt (111-100)-(154-153) = 10; offset
    # ((153-100)+(154-111))/2 = (53+43)/2 = 48 (true 50: the asymmetry 3 vs 7 costs 2);
    # bound 5 >= |48 - 50|
    ex = Exchange(100, 153, 154, 111)
    assert (ex.rtt_ns, ex.offset_ns, ex.bound_ns) == (10, 48, 5)
    assert ex == _ex(50, 3, 7, t1=100, work=1)


@pytest.mark.parametrize(("out_ns", "back_ns"), [(1, 1), (0, 9 * MS), (9 * MS, 0), (2, 5 * MS)])
def test_the_true_offset_lies_within_the_bound(out_ns: int, back_ns: int) -> None:
    true = -123_456_789
    ex = _ex(true, out_ns, back_ns)
    assert ex.rtt_ns == out_ns + back_ns
    assert abs(ex.offset_ns - true) <= ex.bound_ns


def test_the_smallest_round_trip_is_kept_within_the_window() -> None:
    t = OffsetTracker(window=3)
    assert t.estimate() is None
    with pytest.raises(ValueError, match="offset is unknown"):
        t.to_server(0)
    t.add(_ex(7 * MS, 4 * MS, 4 * MS))  # rtt 8 ms
    t.add(_ex(7 * MS, MS, 3 * MS))  # rtt 4 ms: offset 7 - 1 = 6 ms, bound 2 ms
    t.add(_ex(7 * MS, 3 * MS, 3 * MS))  # rtt 6 ms
    est = t.estimate()
    assert est is not None
    assert (est.rtt_ns, est.offset_ns, est.bound_ns, est.samples) == (4 * MS, 6 * MS, 2 * MS, 3)
    assert t.to_server(10 * MS) == 16 * MS
    t.add(_ex(7 * MS, 5 * MS, 5 * MS))
    t.add(_ex(7 * MS, 5 * MS, 5 * MS))  # the 4 ms exchange has left the window of 3
    est = t.estimate()
    assert est is not None and est.rtt_ns == 6 * MS and est.offset_ns == 7 * MS
    assert not est.flagged and est.as_dict()["bound_ns"] == 3 * MS


def test_a_stepped_clock_is_refused_and_a_wide_bound_flagged() -> None:
    t = OffsetTracker()
    assert not t.add(Exchange(100, 200, 201, 90))  # received before it was sent
    assert not t.add(Exchange(100, 200, 150, 400))  # the server replied before receiving
    assert t.refused == 2 and t.estimate() is None
    assert t.add(_ex(0, 6 * MS, 6 * MS))  # rtt 12 ms: bound 6 ms > 5 ms
    est = t.estimate()
    assert est is not None and est.bound_ns == 6 * MS > MAX_BOUND_NS and est.flagged
    with pytest.raises(ValueError, match="window"):
        OffsetTracker(window=0)
