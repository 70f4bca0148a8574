"""Arrival processes: mean rate, burstiness (gap CV and count dispersion), on/off silence; fixed seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loadtest.arrivals import arrival_times
from loadtest.scenario import Arrival

RATE = 20.0
DURATION = 500.0  # ~10,000 arrivals: the mean's standard error is ~1 %


def _gaps(arrival: Arrival, seed: int = 7) -> np.ndarray:
    return np.diff(arrival_times(RATE, arrival, DURATION, np.random.default_rng(seed)))


def _count_dispersion(times: np.ndarray, bin_s: float = 1.0) -> float:
    counts, _ = np.histogram(times, bins=np.arange(0, DURATION + bin_s, bin_s))
    return float(counts.var() / counts.mean())


def test_poisson_has_the_mean_rate_and_unit_dispersion() -> None:
    times = arrival_times(RATE, Arrival(process="poisson"), DURATION, np.random.default_rng(1))
    expected = RATE * DURATION
    assert abs(len(times) - expected) < 4 * math.sqrt(expected)  # Poisson count: sd = sqrt(mean)
    gaps = np.diff(times)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)  # exponential gaps: CV 1
    assert _count_dispersion(times) == pytest.approx(1.0, abs=0.2)  # Poisson counts: var = mean
    assert np.all(np.diff(times) >= 0) and times.min() >= 0 and times.max() < DURATION


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 2.0, 4.0])
def test_gamma_keeps_the_rate_and_sets_the_cv_like_vllm(burstiness: float) -> None:
    # vllm bench serve: shape = burstiness, scale = 1/(rate·burstiness) → mean 1/rate, CV 1/sqrt(b).
    gaps = _gaps(Arrival(process="gamma", burstiness=burstiness))
    assert gaps.mean() == pytest.approx(1.0 / RATE, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0 / math.sqrt(burstiness), rel=0.08)


def test_lower_burstiness_gives_burstier_counts() -> None:
    rng = np.random.default_rng(3)
    bursty = _count_dispersion(arrival_times(RATE, Arrival(process="gamma", burstiness=0.25), DURATION, rng))
    regular = _count_dispersion(arrival_times(RATE, Arrival(process="gamma", burstiness=4.0), DURATION, rng))
    # Renewal-process asymptotics: count dispersion → CV² = 1/burstiness (4 and 0.25).
    assert bursty == pytest.approx(4.0, rel=0.3)
    assert regular == pytest.approx(0.25, rel=0.3)


def test_constant_is_exactly_periodic() -> None:
    times = arrival_times(4.0, Arrival(process="constant"), 10.0, np.random.default_rng(0))
    assert len(times) == 40
    assert np.allclose(np.diff(times), 0.25)


def test_on_off_is_silent_when_off_and_at_rate_when_on() -> None:
    arrival = Arrival(process="on_off", on_s=2.0, off_s=3.0)
    times = arrival_times(RATE, arrival, DURATION, np.random.default_rng(5))
    phase = np.mod(times, 5.0)
    assert np.all(phase < 2.0)  # nothing in the 3 s off-periods
    on_time = DURATION * 2.0 / 5.0
    assert abs(len(times) - RATE * on_time) < 4 * math.sqrt(RATE * on_time)


def test_same_seed_same_arrivals() -> None:
    a = arrival_times(RATE, Arrival(process="gamma", burstiness=0.5), 50, np.random.default_rng(9))
    b = arrival_times(RATE, Arrival(process="gamma", burstiness=0.5), 50, np.random.default_rng(9))
    assert np.array_equal(a, b)
