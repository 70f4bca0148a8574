"""Arrival rates now and their trends, as the SLA policy reads them: per tenant from its arrivals in
the signals window (``rate_trend``: its second half against its first), then per class from its
tenants' shares (``class_rate``).

The policy extends a class's trend for one replica start time (``sla_predict``), often several
windows long, so a trend that is not there buys replicas. Under Poisson arrivals at a level rate
the halves' difference has variance ``n``, so a clump reads as a slope: on the shapes of issue 46's
one-card run (a steady load at a third of one replica, a 46-s start) the slope alone asked for more
replicas in 269 of 2,400 decisions (``tests/cluster/serving/test_sla_rate.py``). A class keeps its
summed trend only where it stands out of the summed noise by ``Z`` standard deviations; else it
reads no trend, and each tenant at its window's mean: 2 of the 2,400 then, and on the simulated
day interactive attainment 0.9907 → 0.9920 at 9.57 → 9.30 replica-hours. Judged per class, not
per tenant: a flash crowd of many tenants each too sparse to show a trend is one in their sum.

Not done here: an onset (a tenant or class that began inside the window) still reads as a ramp.
Read as a level instead, the simulated day's start (a cold cluster, every tenant arriving at once)
lost interactive attainment 0.991 → 0.982: the policy's catch-up for the backlog that piles up
while replicas start leans on that overshoot.

The router (``sla_router_signals``) and the simulator (``loadtest/sim/sla_autoscaler``) both read
rates here, so the simulated policy sees what the deployed one does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z = 3.0  # standard deviations of Poisson noise a class's trend must exceed (2 let 2.6% through)


@dataclass(frozen=True, slots=True)
class RateTrend:
    """One tenant's arrivals in the window."""

    rate_rps: float  # the trend's value now (the window's mean + slope × half the window)
    slope: float  # change of the rate per second
    window_rate_rps: float  # the window's arrivals over its whole length
    trend_rps: float = 0.0  # the part of ``rate_rps`` that is the trend's (slope × half the window)
    slope_var: float = 0.0  # the slope's variance under Poisson arrivals at a level rate


def rate_trend(arrivals: Sequence[float], now: float, window_s: float) -> RateTrend:
    """The rate and trend of ``arrivals`` (times within ``window_s`` before ``now``)."""
    n = len(arrivals)
    if n == 0:
        return RateTrend(0.0, 0.0, 0.0)
    half = window_s / 2
    early = sum(1 for a in arrivals if a < now - half)
    slope = ((n - early) - early) / half / half
    level = n / window_s
    return RateTrend(max(0.0, level + slope * half), slope, level, slope * half, n / half**4)


@dataclass(frozen=True, slots=True)
class ClassRate:
    rate_rps: float  # the class's part (its tenants' shares of it), now
    slope: float


def class_rate(parts: Sequence[tuple[RateTrend, float]]) -> ClassRate:
    """A class's part from its tenants' readings, each with the share ``f`` of it that counts."""
    slope = sum(t.slope * f for t, f in parts)
    noise = Z * math.sqrt(sum(t.slope_var * f * f for t, f in parts))
    if abs(slope) > noise:
        return ClassRate(sum(t.rate_rps * f for t, f in parts), slope)
    return ClassRate(sum(max(0.0, t.rate_rps - t.trend_rps) * f for t, f in parts), 0.0)
