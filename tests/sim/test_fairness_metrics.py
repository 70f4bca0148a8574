"""The simulator's fairness figures by hand: settled service (received), backlog through a window,
fair share, and the within-tier gap over settled service."""

from __future__ import annotations

import numpy as np
import pytest

from loadtest.sim.fair_share import water_level, within_share
from loadtest.sim.outcomes import OK, BacklogSampler, Outcomes
from loadtest.sim.service_curve import delivered_service
from loadtest.sim.summary import FAIRNESS_DEFINITIONS, _group_jains, _max_gap_at
from tests.sim.conftest import make_trace


def test_service_is_counted_as_received_prompt_at_first_token_output_over_the_stream() -> None:
    trace = make_trace([(0.0, 0, 100, 50), (0.0, 1, 10, 10)], [("a", "batch", 1.0), ("b", "batch", 2.0)])
    outcomes = Outcomes(2)
    outcomes.done(0, first_token=2.0, now=12.0, output=50, replica=0)
    outcomes.done(1, first_token=1.0, now=1.0, output=10, replica=0)
    times = np.array([0.0, 2.0, 7.0, 12.0, 20.0])
    s = delivered_service(trace, outcomes, times)
    # a: 100 prompt at t=2; 100 output-weighted tokens accrue linearly over [2, 12]
    assert s[:, 0] == pytest.approx([0, 100, 150, 200, 200])
    # b (weight 2): (10 + 2·10)/2 all at t=1
    assert s[:, 1] == pytest.approx([0, 15, 15, 15, 15])
    outcomes.status[1] = OK + 3  # a failed request delivers nothing
    assert delivered_service(trace, outcomes, times)[:, 1] == pytest.approx([0] * 5)


def test_a_tenant_that_empties_between_samples_is_not_backlogged_through_it() -> None:
    sampler = BacklogSampler(2)
    sampler.enqueued(0)
    sampler.enqueued(1)
    sampler.sample(0.0)
    sampler.dequeued(1)  # tenant 1 empties ...
    sampler.enqueued(1)  # ... and returns before the next sample
    sampler.sample(5.0)
    sampler.sample(10.0)
    _, backlog = sampler.arrays()
    assert backlog.tolist() == [[False, False], [True, False], [True, True]]


def test_water_filling_meets_small_demands_and_splits_the_rest_by_weight() -> None:
    demand = np.array([1.0, 2.0, 50.0, 50.0])
    weight = np.array([1.0, 1.0, 1.0, 3.0])
    level = water_level(demand, weight, capacity=23.0)  # 1 + 2 met; 20 left split 1:3
    assert level == pytest.approx(5.0)
    assert water_level(demand, weight, capacity=1000.0) == float("inf")


def test_within_share_on_a_trace() -> None:
    rows = [(float(t), 0, 10, 10) for t in range(10)] + [(0.5, 1, 10, 10), (9.0, 1, 0, 0)]
    trace = make_trace(rows, [("heavy", "batch", 1.0), ("light", "batch", 1.0)])
    # capacity 1 req/s × mean cost 27.5 = 27.5 tokens/s; demands 300/9 and 30/9 tokens/s
    assert within_share(trace).tolist() == [False, True]


def test_jain_per_window_and_group_over_backlogged_tenants_only() -> None:
    service = np.array([[0, 0, 0], [10, 10, 0], [20, 30, 5]], dtype=float)
    backlog = np.array([[1, 1, 1], [1, 1, 1], [1, 1, 0]], dtype=bool)
    jains = _group_jains(service, backlog, {("c", 1.0): [0, 1, 2]}, lag=1)
    # window [0,1]: all three backlogged, (10, 10, 0) -> 400/(3·200); window [1,2]: (10, 20) -> 900/(2·500)
    assert jains == pytest.approx([400 / 600, 900 / 1000])


def test_max_gap_says_where_it_is_and_how_many_tenants_it_compares() -> None:
    service = np.array([[0, 0, 0, 0], [10, 16, 0, 0], [20, 30, 5, 9], [30, 40, 10, 18]], dtype=float)
    backlog = np.ones((4, 4), dtype=bool)
    backlog[1, 2] = False  # tenant 2 is not backlogged through the first interval
    groups = {("a", 1.0): [0, 1, 2], ("b", 2.0): [3]}
    # windows of one interval: [0,1] (0, 1 compared: 10 vs 16), [1,2] (10, 14, 5: 9), [2,3] (10, 10, 5: 5)
    gap, where, row = _max_gap_at(service, backlog, groups, lag=1)
    assert gap == pytest.approx(9.0) and row == 1
    assert where == {"sla_class": "a", "weight": 1.0, "tenants": 3}
    assert _max_gap_at(service, backlog, {("b", 2.0): [3]}, lag=1) is None  # one tenant: nothing to compare


def test_the_within_tier_gap_is_over_settled_service_received_not_work_dispatched_in_flight() -> None:
    """a and b are dispatched together, so the queue charges them alike; a's answer arrives in [0, 10],
    b's in [20, 30]. Over [0, 10] a received 200 weighted tokens and b none, still in flight: the gap
    is 200. Over [0, 30] both have received theirs: the gap closes."""
    trace = make_trace([(0.0, 0, 100, 50), (0.0, 1, 100, 50)], [("a", "batch", 1.0), ("b", "batch", 1.0)])
    outcomes = Outcomes(2)
    outcomes.dispatched[:] = 0.0
    outcomes.done(0, first_token=1.0, now=9.0, output=50, replica=0)
    outcomes.done(1, first_token=21.0, now=29.0, output=50, replica=0)
    times = np.array([0.0, 10.0, 20.0, 30.0])
    service = delivered_service(trace, outcomes, times)
    assert service[:, 1] == pytest.approx([0, 0, 0, 200])  # b's in-flight work counts only once received
    backlog, group = np.ones((4, 2), dtype=bool), {("batch", 1.0): [0, 1]}
    gap, _, row = _max_gap_at(service, backlog, group, lag=1)
    assert gap == pytest.approx(200.0) and row == 0
    assert _max_gap_at(service, backlog, group, lag=3)[0] == pytest.approx(0.0)
    assert FAIRNESS_DEFINITIONS["service"].startswith("settled service")
