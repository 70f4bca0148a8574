"""A class's rate and trend as the SLA policy reads them (``cluster/serving/sla_rate.py``, summed by
``sla_share.class_loads``): Poisson noise reads as no trend, so a steady load does not buy replicas;
a real ramp is a trend, also one spread over many tenants each too sparse to show it alone.

The shapes are those of the one-card run of issue 46 (2026-12-07): alice at 7.85 req/s on the 1B
shape, four sequences a replica, a replica's start 46 s. Arrivals are seeded, so every run sees the
same ones.
"""

from __future__ import annotations

import random

import pytest

from cluster.serving.sla_capacity import shape_of
from cluster.serving.sla_policy import SlaPolicyConfig, decide
from cluster.serving.sla_rate import RateTrend, rate_trend
from cluster.serving.sla_share import TenantLoad, class_loads
from cluster.serving.sla_signals import ClassLoad, PoolState, Work

WINDOW_S, RATE, START_S = 10.0, 7.85, 46.0
SHAPE = shape_of("h200-llama-3.2-1b", 4, 0.9)
CONFIG = SlaPolicyConfig(min_replicas=1, max_replicas=3, horizon_s=10.0)


def _poisson(rate: float, until: float, rng: random.Random, rise: float = 0.0) -> list[float]:
    """Arrivals from 0 to ``until`` at ``rate`` + ``rise``·t per second (thinned)."""
    peak = rate + rise * until
    out, t = [], 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= until:
            return out
        if rng.random() < (rate + rise * t) / peak:
            out.append(t)


def _tenant(name: str, arrivals: list[float], now: float, noise: bool = True) -> TenantLoad:
    """The tenant as the router publishes it (``sla_router_signals``); ``noise=False``: without its
    slope's variance, as before the class judged it (the slope taken as it is)."""
    r = rate_trend([a for a in arrivals if now - WINDOW_S <= a <= now], now, WINDOW_S)
    return TenantLoad(
        name, "interactive", 1.0, demand=1.0, rate_rps=r.rate_rps, rate_slope=r.slope,
        mean_prompt_tokens=300, mean_output_tokens=80, window_rate_rps=r.window_rate_rps,
        trend_rps=r.trend_rps if noise else 0.0, slope_var=r.slope_var if noise else 0.0,
    )  # fmt: skip


def _class(tenants: list[TenantLoad]) -> Work:
    target = ClassLoad("interactive", 0, 1.0, 0.1, 0.99, Work(), Work())
    (load,) = class_loads(tenants, capacity=1e9, targets=[target])
    return load.within


def _desired(arrivals: list[float], now: float, noise: bool = True) -> int:
    """The policy's count for one interactive tenant whose arrivals these are."""
    work = _class([_tenant("alice", arrivals, now, noise)])
    load = ClassLoad("interactive", 0, 1.0, 0.1, 0.99, work, Work())
    return decide([load], PoolState(ready=1, start_time_s=START_S), SHAPE, CONFIG).desired


def test_a_steady_load_at_a_third_of_one_replica_does_not_ask_for_more() -> None:
    assert RATE * SHAPE.request_s(300, 80) < 0.35  # a third of one replica's modelled capacity
    rng = random.Random(46)
    loads = [_poisson(RATE, 80.0, rng) for _ in range(20)]
    times = [15.0 + 0.5 * i for i in range(120)]  # once the window holds only the steady load
    asked = [_desired(arrivals, now) for arrivals in loads for now in times]
    assert sum(d > 1 for d in asked) <= 0.005 * len(asked), sum(d > 1 for d in asked)
    # The slope taken as it is (the reading before) asks for more in about 1 decision in 9.
    before = [_desired(arrivals, now, noise=False) for arrivals in loads for now in times]
    assert sum(d > 1 for d in before) >= 0.05 * len(before), sum(d > 1 for d in before)


def test_noise_reads_as_no_trend_and_the_rate_as_the_windows_mean() -> None:
    arrivals = _poisson(RATE, 80.0, random.Random(7))
    read = [_class([_tenant("alice", arrivals, float(now))]) for now in range(15, 80)]
    assert sum(1 for w in read if w.rate_slope != 0.0) <= 1
    for w in read:
        if w.rate_slope == 0.0:
            assert w.rate_rps == pytest.approx(w.window_rate_rps)
        assert w.rate_rps == pytest.approx(RATE, rel=0.35)


def test_a_steep_ramp_reads_as_a_trend() -> None:
    # +4 req/s each second from 2: at 10 s the window's halves differ by ~100 arrivals, about 8
    # standard deviations of their noise (a ramp of 1 req/s² at ~30 req/s is ~1.4: read as no trend,
    # its rate then rises on its own; the next test)
    rng = random.Random(5)
    read = [_class([_tenant("alice", _poisson(2.0, 12.0, rng, rise=4.0), 12.0)]) for _ in range(10)]
    assert all(w.rate_slope > 0 for w in read), [w.rate_slope for w in read]
    assert sum(w.rate_slope for w in read) / len(read) == pytest.approx(4.0, rel=0.25)
    assert sum(w.rate_rps for w in read) / len(read) == pytest.approx(50.0, rel=0.15)


def test_a_ramp_scales_up_before_its_rate_reaches_one_replica() -> None:
    rng = random.Random(3)
    ramps = [_poisson(2.0, 40.0, rng, rise=1.0) for _ in range(10)]  # +1 req/s each second from 2
    capacity = 1 / SHAPE.request_s(300, 80)
    for arrivals in ramps:  # an up before the rate itself reaches one replica's capacity
        first = next(now for now in [5.0 + 0.5 * i for i in range(60)] if _desired(arrivals, now) > 1)
        assert 2.0 + first < capacity, (first, capacity)


def test_a_ramp_spread_over_many_sparse_tenants_is_a_trend_of_their_class() -> None:
    # 300 tenants, each rising from 0.05 to 0.45 req/s over 40 s: hardly one's own slope stands out
    # of its noise, but the class rises from 15 to 135 req/s, and its trend is plain in the sum.
    rng = random.Random(11)
    tenants = [_tenant(f"t{i}", _poisson(0.05, 40.0, rng, rise=0.01), 30.0) for i in range(300)]
    alone = sum(1 for t in tenants if _class([t]).rate_slope != 0.0)
    assert alone <= 15, alone
    summed = _class(tenants)
    assert summed.rate_slope == pytest.approx(300 * 0.01, rel=0.5)
    assert summed.rate_rps == pytest.approx(300 * 0.35, rel=0.2)


def test_no_arrivals_and_a_lone_one() -> None:
    assert rate_trend([], 5.0, WINDOW_S) == RateTrend(0.0, 0.0, 0.0)
    lone = rate_trend([4.99], 5.0, WINDOW_S)
    assert lone.window_rate_rps == 0.1 and lone.slope_var == pytest.approx(1 / 5**4)
    assert _class([_tenant("bob", [4.99], 5.0)]).rate_slope == 0.0  # one arrival is no trend
