"""The SLA autoscaling policy's core (cluster/serving/sla_*.py): pure functions, no Ray.

The shape is the simulator's 8B-on-H200 step model at a batch of 32: a request of 300 prompt and
150 answer tokens costs 0.045 replica-seconds, so a replica serves about 22 of them a second.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from cluster.serving.sla_capacity import shape_of
from cluster.serving.sla_policy import DelayGate, SlaPolicyConfig, bound, decide
from cluster.serving.sla_predict import predict
from cluster.serving.sla_share import TenantLoad, class_loads, within_fraction
from cluster.serving.sla_signals import ClassLoad, PoolState, StepPace, Work

SHAPE = shape_of("h200-llama-3.1-8b", 32)
PER_REPLICA = 1 / SHAPE.request_s(300, 150)  # requests per second one replica serves


def work(rate: float = 0.0, waiting: float = 0.0, slope: float = 0.0) -> Work:
    return Work(waiting, 300 * waiting, 150 * waiting, rate, slope, 300, 150)


def interactive(within: Work | None = None, over: Work | None = None) -> ClassLoad:
    return ClassLoad("interactive", 0, 1.0, 0.1, 0.99, within or Work(), over or Work())


def batch(within: Work | None = None, over: Work | None = None) -> ClassLoad:
    return ClassLoad("batch", 2, 60.0, 1.0, 0.99, within or Work(), over or Work())


def pool(ready: int, start_s: float = 60.0, starting: int = 0) -> PoolState:
    return PoolState(ready=ready, starting=starting, start_time_s=start_s)


CFG = SlaPolicyConfig(min_replicas=1, max_replicas=8)


def test_a_rising_interactive_rate_scales_up_while_the_current_count_still_meets_its_target() -> None:
    rising = interactive(work(rate=0.8 * 2 * PER_REPLICA, slope=0.2))  # 80% of 2 replicas, +0.2 req/s²
    now = predict([rising], pool(2), SHAPE, 2, horizon_s=1.0)
    assert now.attainment["interactive"] == 1.0  # nothing misses over the next second...
    d = decide([rising], pool(2), SHAPE, CFG)
    assert d.desired == 3 and d.reason.startswith("up")  # ...but it would before a new replica started
    assert d.predictions[0].attainment["interactive"] < 0.99


def test_the_start_time_is_counted() -> None:
    rising = [interactive(work(rate=0.8 * 2 * PER_REPLICA, slope=0.2))]
    quick, slow = decide(rising, pool(2, start_s=5.0), SHAPE, CFG), decide(rising, pool(2), SHAPE, CFG)
    assert (
        quick.desired == 2 and slow.desired == 3
    )  # a 5-s start still serves in time; a 60-s one must go now
    # a replica still starting counts from when it serves
    started = decide(
        rising, PoolState(ready=2, starting=1, starting_left_s=10.0, start_time_s=60.0), SHAPE, CFG
    )
    assert started.desired == 3 and started.reason.startswith("hold")


def test_an_over_share_backlog_alone_never_scales_up() -> None:
    flood = batch(over=work(rate=5 * PER_REPLICA, waiting=20_000))
    d = decide([flood, interactive(work(rate=1.0))], pool(1), SHAPE, CFG)
    assert d.desired == 1 and d.reason.startswith("hold")
    asked = SlaPolicyConfig(min_replicas=1, max_replicas=8, scale_for_over_share=True)
    assert decide([flood, interactive(work(rate=1.0))], pool(1), SHAPE, asked).desired > 1


def test_within_share_batch_work_that_keeps_its_60_s_target_does_not_scale_up() -> None:
    patient = batch(work(rate=0.5 * PER_REPLICA, waiting=200))  # 9 s of work, 60-s target
    assert decide([patient], pool(1), SHAPE, CFG).desired == 1


def test_scale_down_only_while_every_class_keeps_its_target_with_one_fewer() -> None:
    light = [interactive(work(rate=1.5 * PER_REPLICA)), batch(work(rate=0.5 * PER_REPLICA))]
    d = decide(light, pool(4), SHAPE, CFG)
    # with the 20% headroom, 2 replicas would carry interactive's 1.8 replicas of work but leave
    # batch 0.2 for its 0.6: its queue would outgrow its 60-s target within the horizon
    assert d.desired == 3 and d.reason.startswith("down")
    assert [p.replicas for p in d.predictions] == [4, 3, 2]
    falling = [interactive(work(rate=1.5 * PER_REPLICA, slope=-0.5))]  # a falling trend is not counted on
    assert decide(falling, pool(4), SHAPE, CFG).desired == 2
    near = [interactive(work(rate=2.5 * PER_REPLICA)), batch(work(rate=0.4 * PER_REPLICA))]
    d = decide(near, pool(3), SHAPE, CFG)
    assert d.desired == 3 and "interactive" in d.reason  # 2 replicas would not carry 2.9 replicas' work
    assert decide([interactive()], pool(1), SHAPE, CFG).desired == 1  # never below min_replicas


def test_bounds_and_the_cost_ceiling() -> None:
    surge = [interactive(work(rate=40 * PER_REPLICA, waiting=100))]
    assert decide(surge, pool(2), SHAPE, CFG).desired == 8  # max_replicas
    priced = SlaPolicyConfig(1, 8, max_gpu_dollars_per_hour=16.0, gpu_dollars_per_hour=5.0)
    assert bound(priced) == 3
    d = decide(surge, pool(2), SHAPE, priced)
    assert d.desired == 3 and d.bound == 3
    over = decide([interactive()], pool(5), SHAPE, priced)  # above the ceiling: back to it
    assert over.desired == 3 and "bound" in over.reason
    assert bound(SlaPolicyConfig(2, 8, max_gpu_dollars_per_hour=1.0)) == 2  # never below min


def test_misses_that_no_new_replica_can_reach_do_not_scale_up() -> None:
    # 500 requests wait now (a second of 8 replicas' work): some miss whatever is asked for, and the
    # arrivals after a start are served in time at the current count
    backlog = [interactive(work(rate=0.5 * PER_REPLICA, waiting=500))]
    d = decide(backlog, pool(2), SHAPE, CFG)
    assert d.predictions[0].attainment["interactive"] < 0.99
    assert d.desired == 2 and "before a replica" in d.reason


def test_the_delay_gate_applies_a_change_once_asked_for_that_long() -> None:
    gate = DelayGate(upscale_delay_s=10.0, downscale_delay_s=30.0)
    assert gate.apply(3, 2, now=0.0) == 2
    assert gate.apply(3, 2, now=9.0) == 2
    assert gate.apply(3, 2, now=10.0) == 3
    assert gate.apply(1, 3, now=11.0) == 3
    assert gate.apply(3, 3, now=20.0) == 3  # a hold restarts the wait
    assert gate.apply(2, 3, now=25.0) == 3 and gate.apply(2, 3, now=55.0) == 2


def test_within_share_is_max_min_by_weight_at_the_bound() -> None:
    a = TenantLoad("a", "interactive", 1.0, demand=10.0)
    b = TenantLoad("b", "batch", 1.0, demand=100.0)
    assert within_fraction([a, b], capacity=200.0) == {"a": 1.0, "b": 1.0}
    assert within_fraction([a, b], capacity=50.0) == {"a": 1.0, "b": pytest.approx(0.4)}
    alone = within_fraction([b], capacity=50.0)
    assert alone["b"] == pytest.approx(0.5)  # a lone tenant may use the whole bound, no more


def test_class_loads_split_waiting_work_and_rates_by_share() -> None:
    flood = TenantLoad("b", "batch", 1.0, 100.0, 4.0, 0.0, 300, 150, 40, 12000, 6000)
    quiet = TenantLoad("a", "interactive", 1.0, 10.0, 1.0, 0.0, 300, 150, 2, 600, 300)
    loads = class_loads([flood, quiet], 50.0, [interactive(), batch()], {"interactive": (0.2, 0.01)})
    inter, bat = loads
    assert inter.within.waiting_requests == 2 and inter.over.waiting_requests == 0
    assert inter.measured_ttft_s == 0.2
    assert bat.within.waiting_requests == pytest.approx(16) and bat.over.waiting_requests == pytest.approx(24)
    assert bat.within.rate_rps == pytest.approx(1.6) and bat.within.mean_prompt_tokens == 300


def test_a_tpot_over_the_target_misses_the_class() -> None:
    tight = ClassLoad("interactive", 0, 1.0, 0.004, 0.99, work(rate=1.0))  # 4 ms: below the 4.9 ms step
    p = predict([tight], pool(2), SHAPE, 2, horizon_s=30.0)
    assert p.attainment["interactive"] == 0.0 and p.tpot_s > 0.004


def test_a_miss_no_count_changes_neither_adds_nor_holds_replicas() -> None:
    # A TPOT target under one step at a batch of one: every count misses alike. The policy asked for
    # one more replica at every decision and then held the bound (seen on a loaded 2-core box, where
    # the replicas' own speed set the TPOT): replicas that buy nothing are not bought, and go.
    tight = [ClassLoad("interactive", 0, 1.0, 0.004, 0.99, work(rate=0.2))]
    held = decide(tight, pool(2), SHAPE, CFG)
    assert held.desired == 1 and held.reason.startswith("down") and "bought nothing" in held.reason
    assert decide(tight, pool(1), SHAPE, CFG).desired == 1
    # where the miss is a queue, one fewer predicts worse: the bound is held, never shed
    surge = [interactive(work(rate=40 * PER_REPLICA, waiting=100))]
    at_bound = decide(surge, pool(8), SHAPE, CFG)
    assert at_bound.desired == 8 and at_bound.reason.startswith("hold")
    # and where more replicas predict better, the catch-up still scales up
    assert decide(surge, pool(2), SHAPE, CFG).desired == 8


def _paced(ready: int, per_step_s: float, steps: int = 100) -> PoolState:
    """``ready`` replicas whose last ``steps`` decode steps at a batch of 32 took ``per_step_s`` each."""
    ctx = 32 * 375  # 300 prompt + half of 150 answer tokens per sequence
    pace = StepPace(steps, 32 * steps, 0, ctx * steps, per_step_s * steps)
    return PoolState(ready=ready, start_time_s=60.0, pace=pace)


def test_replicas_slower_than_the_step_model_are_priced_at_their_measured_speed() -> None:
    # 0.7 of a modelled replica's rate: one replica keeps the goal at the model's speed. Replicas
    # whose steps took 3× what the model prices them at (a slice of a smaller card) serve a third of
    # it: one is not enough, and the policy asks for the count that serves it.
    load = [interactive(work(rate=0.7 * PER_REPLICA))]
    step_s = SHAPE.step.step_ms(32, 0, 32 * 375) / 1000.0
    held = decide(load, _paced(1, step_s), SHAPE, CFG)
    assert held.desired == 1 and held.slowdown == pytest.approx(1.0)
    up = decide(load, _paced(1, 3 * step_s), SHAPE, CFG)
    assert up.slowdown == pytest.approx(3.0) and up.reason.startswith("up")
    assert up.desired >= 3  # 2.1 modelled replicas of work at the measured speed
    assert up.as_dict()["slowdown"] == pytest.approx(3.0)  # published with the decision
    # too few steps leave the model as it is; a stall's wild ratio is bounded
    assert decide(load, _paced(1, 3 * step_s, steps=5), SHAPE, CFG).slowdown == 1.0
    assert decide(load, _paced(1, 1e3 * step_s), SHAPE, CFG).slowdown == 20.0


def test_one_fewer_that_leaves_more_queued_is_worse_even_where_both_miss_alike() -> None:
    # On one H100 after a burst no count could serve, the backlog's requests missed at 3 replicas and
    # at 2 alike (both 0.017), their TTFTs within the horizon alike: 2 "predicted no worse" and the
    # policy let a replica go with the queue still draining. The work each leaves is what differs.
    from cluster.serving.sla_policy import _no_worse
    from cluster.serving.sla_signals import Prediction

    cls = [interactive(work(rate=1.0, waiting=400))]
    now = Prediction(3, {"interactive": 0.017}, {"interactive": 0.505}, 0.0044, {}, {"interactive": 12.0})
    fewer = Prediction(2, {"interactive": 0.017}, {"interactive": 0.505}, 0.0044, {}, {"interactive": 25.0})
    assert not _no_worse(fewer, now, cls)
    drained = Prediction(2, {"interactive": 0.017}, {"interactive": 0.505}, 0.0044, {}, {"interactive": 0.0})
    assert _no_worse(drained, replace(now, backlog_s={"interactive": 0.0}), cls)  # a TPOT-only miss: let go
    # and the prediction carries the backlog: more replicas leave less of a queue behind
    queue = [interactive(work(rate=2 * PER_REPLICA, waiting=2_000))]
    at = {n: predict(queue, pool(n), SHAPE, n, horizon_s=10.0).backlog_s["interactive"] for n in (2, 3)}
    assert at[3] < at[2] and at[3] > 0


def test_a_decision_whose_backlog_outlasts_the_horizon_is_strict_json() -> None:
    # A within-share backlog no count drains within the horizon predicts an infinite TTFT. The
    # decision goes to the board and /admin/state as JSON, which has no inf: there it is None (an
    # inf once turned every /admin/state call into an error for as long as the backlog lasted).
    import json
    import math

    backlog = interactive(work(rate=50 * PER_REPLICA, waiting=20_000))
    d = decide([backlog], pool(1), SHAPE, CFG)
    assert any(math.isinf(t) for p in d.predictions for t in p.ttft_s.values())
    published = json.loads(json.dumps(d.as_dict(), allow_nan=False))
    assert None in (p["ttft_s"]["interactive"] for p in published["predictions"])
    assert published["desired"] == d.desired
