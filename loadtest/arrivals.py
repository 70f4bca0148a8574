"""Arrival times of open-loop tenants: pure functions of (process, rate, duration, rng).

Gamma follows ``vllm bench serve``: inter-arrival ~ Gamma(shape=burstiness, scale=1/(rate·burstiness)),
so the mean gap is 1/rate whatever the burstiness, and the gaps' coefficient of variation is
1/sqrt(burstiness). Poisson is burstiness 1 (exponential gaps).
"""

from __future__ import annotations

import numpy as np

from loadtest.scenario import Arrival


def gamma_gaps(rate: float, burstiness: float, n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)


def _times_from_gaps(gap_source, rate: float, duration_s: float) -> np.ndarray:
    """Cumulative gaps until ``duration_s``; drawn in chunks so the count is not guessed up front."""
    chunk = max(16, int(rate * duration_s * 1.5) + 16)
    times: list[np.ndarray] = []
    last = 0.0
    while True:
        cum = last + np.cumsum(gap_source(chunk))
        inside = cum[cum < duration_s]
        times.append(inside)
        if len(inside) < len(cum):
            break
        last = float(cum[-1])
    return np.concatenate(times)


def on_off_times(rate: float, arrival: Arrival, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Poisson at ``rate`` during each on-period [k·(on+off), k·(on+off)+on); silent otherwise."""
    period = arrival.on_s + arrival.off_s
    out: list[np.ndarray] = []
    start = 0.0
    while start < duration_s:
        span = min(arrival.on_s, duration_s - start)
        out.append(start + _times_from_gaps(lambda n: rng.exponential(1.0 / rate, n), rate, span))
        start += period
    return np.concatenate(out) if out else np.empty(0)


def arrival_times(rate: float, arrival: Arrival, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Send offsets (seconds from the start, ascending, all < duration_s) for one tenant."""
    if arrival.process == "constant":
        return np.arange(0.0, duration_s, 1.0 / rate)
    if arrival.process == "on_off":
        return on_off_times(rate, arrival, duration_s, rng)
    shape = 1.0 if arrival.process == "poisson" else arrival.burstiness
    return _times_from_gaps(lambda n: gamma_gaps(rate, shape, n, rng), rate, duration_s)
