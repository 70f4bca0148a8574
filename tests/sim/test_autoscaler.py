"""Serve autoscaling semantics: delays, replica start time, draining, cost."""

from __future__ import annotations

import pytest

from loadtest.sim.autoscaler import Autoscaler
from loadtest.sim.events import EventLoop
from loadtest.sim.simulation import simulate
from loadtest.sim.spec import POLICIES, AutoscalingSpec, ClusterSpec
from tests.sim.conftest import make_config, make_trace


class _Pool:
    def __init__(self, ongoing: int, target: int = 1) -> None:
        self.ongoing, self.target = ongoing, target

    def total_ongoing(self) -> int:
        return self.ongoing

    def add(self, n: int) -> None:
        self.target += n

    def remove(self, n: int) -> None:
        self.target -= n


def _spec(**kw) -> AutoscalingSpec:
    base = {
        "min_replicas": 1,
        "max_replicas": 8,
        "target_ongoing_requests": 2,
        "upscale_delay_s": 3,
        "downscale_delay_s": 5,
        "metrics_interval_s": 1,
        "look_back_period_s": 1,
        "replica_start_s": 0,
    }
    return AutoscalingSpec.model_validate(base | kw)


def test_upscale_after_the_upscale_delay():
    loop, pool = EventLoop(), _Pool(ongoing=10)
    scaler = Autoscaler(loop, pool, _spec(), lambda: loop.now < 20)
    scaler.start()
    loop.run(until=2.5)
    assert pool.target == 1  # desired 5 for two decisions only
    loop.run(until=3.0)
    assert pool.target == 5 and scaler.decisions == [(3.0, 5)]


def test_downscale_after_the_downscale_delay_and_never_below_min():
    loop, pool = EventLoop(), _Pool(ongoing=0, target=4)
    scaler = Autoscaler(loop, pool, _spec(), lambda: loop.now < 20)
    scaler.start()
    loop.run(until=4.9)
    assert pool.target == 4
    loop.run(until=5.0)
    assert pool.target == 1


def test_a_brief_spike_does_not_scale():
    loop, pool = EventLoop(), _Pool(ongoing=10)
    scaler = Autoscaler(loop, pool, _spec(look_back_period_s=0.5), lambda: loop.now < 20)
    scaler.start()
    loop.at(2.5, setattr, pool, "ongoing", 2)  # back to target before the third decision
    loop.run()
    assert scaler.decisions == []


def test_simulated_cluster_adds_a_replica_that_serves_after_its_start_time(flat_10ms):
    one = [("t0", "interactive", 1.0)]
    rows = [(0.01 * k, 0, 16, 200) for k in range(400)]  # 2 s requests, 100/s: far above one replica
    trace = make_trace(rows, one)
    a = _spec(max_replicas=4, target_ongoing_requests=4, upscale_delay_s=1, replica_start_s=2.0)
    cluster = ClusterSpec(replicas=1, kv_blocks=100_000, replica_room=8, autoscaling=a)
    run = simulate(trace, make_config(one), POLICIES["fairlane"], cluster, flat_10ms)
    first_up = run.scale_decisions[0]
    assert first_up[0] == pytest.approx(1.0) and first_up[1] > 1
    used = set(run.outcomes.replica.tolist())
    assert len(used) > 1
    second = run.outcomes.dispatched[run.outcomes.replica == max(used)]
    assert second.min() >= first_up[0] + 2.0  # nothing reaches a replica before it is ready
    assert run.peak_replicas == 4
