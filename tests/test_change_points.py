"""E-Divisive means (app/analysis/change_points.py): the statistic against a hand
computation and a direct pairwise one, a known shift found at the right run, noise alone
finding none, two shifts, determinism and bad input."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from app.analysis.change_points import e_divisive, earlier_abs_sums, q_values


def test_statistic_by_hand() -> None:
    # z = 1, 2, 10, 11, 12; exponent 1.
    # tau = 2: X = {1, 2}, Y = {10, 11, 12}, m = 2, k = 3.
    #   cross = (9+10+11) + (8+9+10) = 57 -> 2/(2*3) * 57 = 19
    #   within X = |1-2| = 1 over C(2,2) = 1 -> 1; within Y = 1+2+1 = 4 over C(3,2) = 3
    #   E = 19 - 1 - 4/3 = 50/3; q = (2*3/5) * 50/3 = 20
    # tau = 3: X = {1, 2, 10}, Y = {11, 12}, m = 3, k = 2.
    #   cross = (10+11) + (9+10) + (1+2) = 43 -> 2/6 * 43 = 43/3
    #   within X = 1+9+8 = 18 over 3 -> 6; within Y = 1 over 1 -> 1
    #   E = 43/3 - 7 = 22/3; q = (6/5) * 22/3 = 8.8
    # tau = 0, 1, 4: a side with fewer than 2 values -> no statistic
    q = q_values([1.0, 2.0, 10.0, 11.0, 12.0])[0]
    assert q[2] == pytest.approx(20.0, abs=1e-12)
    assert q[3] == pytest.approx(8.8, abs=1e-12)
    assert np.isneginf(q[[0, 1, 4]]).all()


def _pairwise_q(z: np.ndarray, tau: int) -> float:
    x, y = z[:tau], z[tau:]
    m, k = len(x), len(y)
    cross = sum(abs(a - b) for a in x for b in y)
    wx = sum(abs(a - b) for a, b in itertools.combinations(x, 2))
    wy = sum(abs(a - b) for a, b in itertools.combinations(y, 2))
    e = 2 * cross / (m * k) - wx / (m * (m - 1) / 2) - wy / (k * (k - 1) / 2)
    return float(m * k / (m + k) * e)


@pytest.mark.parametrize("n", [4, 5, 9, 16, 17, 33])
def test_statistic_matches_pairwise_sums(n: int) -> None:
    rng = np.random.default_rng(n)
    z = np.round(rng.normal(50, 10, n), 1)  # rounded: ties happen
    z[1] = z[0]
    q = q_values(z)[0]
    for tau in range(2, n - 1):
        assert q[tau] == pytest.approx(_pairwise_q(z, tau), rel=1e-10, abs=1e-9)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 100, 257])
def test_earlier_sums_match_a_loop(n: int) -> None:
    rng = np.random.default_rng(n)
    x = np.round(rng.normal(size=(3, n)), 2)
    got = earlier_abs_sums(x)
    want = [[sum(abs(x[p, t] - x[p, i]) for i in range(t)) for t in range(n)] for p in range(3)]
    assert np.allclose(got, np.array(want), rtol=1e-12, atol=1e-9)


def test_known_shift_found_at_the_right_run() -> None:
    rng = np.random.default_rng(7)
    z = np.concatenate([rng.normal(100, 2, 25), rng.normal(112, 2, 15)])
    found = e_divisive(z)
    assert [c.index for c in found] == [25]
    assert found[0].p_value <= 0.01


def test_two_shifts() -> None:
    rng = np.random.default_rng(11)
    z = np.concatenate([rng.normal(100, 2, 20), rng.normal(115, 2, 20), rng.normal(95, 2, 20)])
    assert [c.index for c in e_divisive(z)] == [20, 40]


@pytest.mark.parametrize("seed", range(8))
def test_noise_alone_finds_none(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    assert e_divisive(rng.normal(100, 3, 60)) == []


def test_seeded_and_deterministic() -> None:
    rng = np.random.default_rng(3)
    z = np.concatenate([rng.normal(10, 1, 12), rng.normal(11.5, 1, 12)])
    a, b = e_divisive(z, seed=5), e_divisive(z, seed=5)
    assert a == b


def test_short_and_flat_series() -> None:
    assert e_divisive([]) == []
    assert e_divisive([1.0, 2.0, 3.0]) == []
    assert e_divisive([5.0] * 30) == []  # no spread: no statistic above 0


@pytest.mark.parametrize(
    "values, kw, msg",
    [
        ([1.0, float("nan"), 2.0], {}, "finite"),
        ([1.0, 2.0], {"pvalue": 0.0}, "pvalue"),
        ([1.0, 2.0], {"permutations": 0}, "permutations"),
        ([1.0, 2.0], {"min_size": 1}, "min_size"),
    ],
)
def test_bad_input(values: list[float], kw: dict[str, float], msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        e_divisive(values, **kw)  # type: ignore[arg-type]
