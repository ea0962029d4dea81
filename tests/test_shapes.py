"""Load-shape schedules: statistics of the arrival processes, seeding, rate inf."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.client.shapes import arrival_times_ns, schedule_for
from app.client.spec import RunSpec


def gaps_s(times: np.ndarray) -> np.ndarray:
    return np.diff(times).astype(np.float64) / 1e9


def test_constant_is_exact() -> None:
    t = arrival_times_ns(5, rate=4.0, arrival="constant", rng=np.random.default_rng(0))
    assert t.tolist() == [0, 250_000_000, 500_000_000, 750_000_000, 1_000_000_000]


def test_rate_inf_sends_everything_at_zero() -> None:
    t = arrival_times_ns(7, rate=math.inf, arrival="poisson", rng=np.random.default_rng(0))
    assert t.tolist() == [0] * 7


def test_poisson_mean_rate_and_cv() -> None:
    rate = 20.0
    t = arrival_times_ns(20_001, rate=rate, arrival="poisson", rng=np.random.default_rng(1))
    g = gaps_s(t)
    assert t[0] == 0 and np.all(g >= 0)
    achieved = (len(t) - 1) / (t[-1] / 1e9)
    assert achieved == pytest.approx(rate, rel=0.03)
    assert g.std() / g.mean() == pytest.approx(1.0, abs=0.03)  # exponential: CV 1


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_burstiness(burstiness: float) -> None:
    rate = 10.0
    t = arrival_times_ns(
        40_001, rate=rate, arrival="gamma", burstiness=burstiness, rng=np.random.default_rng(2)
    )
    g = gaps_s(t)
    assert g.mean() == pytest.approx(1 / rate, rel=0.03)
    # gamma(shape=k): CV = 1/sqrt(k); < 1 smoother than Poisson, > 1 burstier
    assert g.std() / g.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_schedule_is_seeded_and_independent_of_other_fields() -> None:
    spec = RunSpec(base_url="http://x", model="m", request_rate=5, num_prompts=50, seed=3)
    a = schedule_for(spec).times_ns
    b = schedule_for(spec.model_copy(update={"input_len": 17, "warmup_requests": 4})).times_ns
    c = schedule_for(spec.model_copy(update={"seed": 4})).times_ns
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_fixed_concurrency_schedule() -> None:
    spec = RunSpec(base_url="http://x", model="m", max_concurrency=4, num_prompts=10)
    s = schedule_for(spec)
    assert s.fixed_concurrency and s.max_concurrency == 4 and s.n == 10


def test_bad_rate() -> None:
    with pytest.raises(ValueError):
        arrival_times_ns(3, rate=0.0, rng=np.random.default_rng(0))
