"""Predicted attainment per SLA class over the next interval, at a given replica count.

A fluid model of the router's priority queue, per class ``k``:

* Work is in replica-seconds (``ReplicaShape.request_s``). ``Q_hi`` is the waiting work of more
  urgent tiers, ``Q_k`` that of ``k``'s tier; arrivals come at the measured rate, extended by its
  trend for one start time (``rate + slope·min(t, start)``, never below 0), then level.
* Serving capacity ``C(t)`` is the replicas that serve at ``t``: the ready ones now, the starting ones
  once their start is over, and those the candidate count adds after one measured start time
  (``PoolState.start_time_s``). A count below the current one loses replicas at once (they drain).
* Each step more urgent work is served first; ``k``'s tier gets the rest. A class-``k`` request
  arriving at ``t`` waits until the capacity left over by more urgent arrivals covers the work ahead
  of it (``Q_hi(t) + Q_k(t)``); its TTFT is that wait + its own first step (``first_token_s``) + a
  calibration ``δ_k`` (the measured TTFT beyond what the model says of now, at most half the target).
* A waiting request at position ``x`` of ``Q_k(0)`` is served once the leftover capacity covers
  ``Q_hi(0) + x``: the share of waiting requests meeting the target is read off that curve.
* TPOT: the step time at the batch the replicas would run (``(running + waiting) / n``, at most the
  full batch), scaled by the class's measured TPOT over the model's TPOT now. Over the class's
  target, every request of the class misses.
* Speed: before any of this, every step time of the model is scaled by ``slowdown`` (what the
  replicas' recent steps took over what the model prices the same steps at), so the capacity and
  the first step are the replicas' own, not those of the machine the step model was fitted on.

Attainment = (waiting requests + arrivals over the horizon that meet TTFT and TPOT) / (all of them);
a class with no work predicts 1. ``late``: the same over the arrivals from one start time on, the
part a replica asked for now can change. ``catch_up``: the replicas that serve the rate at the
horizon's end and clear, within the rest of the horizon, the backlog the current count leaves at one
start time from now (the count when no count keeps the goal within the horizon).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from cluster.serving.sla_capacity import ReplicaShape
from cluster.serving.sla_signals import ClassLoad, PoolState, Prediction, Work

STEPS = 32  # grid steps over the horizon
EPS = 1e-9


def serving_curve(pool: PoolState, n: int) -> Callable[[float], float]:
    """Replicas serving at time ``t`` if ``n`` are asked for now."""
    ready = min(pool.ready, n)
    starting = min(pool.starting, max(0, n - pool.ready))
    added = max(0, n - pool.ready - pool.starting)

    def at(t: float) -> float:
        return (
            ready + (starting if t >= pool.starting_left_s else 0) + (added if t >= pool.start_time_s else 0)
        )

    return at


def predict(
    classes: Sequence[ClassLoad],
    pool: PoolState,
    shape: ReplicaShape,
    n: int,
    horizon_s: float,
    over_share: bool = False,
) -> Prediction:
    """Attainment of each class's within-share requests (all of them with ``over_share``) at ``n``."""
    works = {c.name: _work(c, over_share) for c in classes}
    serving = serving_curve(pool, n)
    tpot = _tpot(classes, pool, shape, n)
    attainment, late, ttft, backlog = {}, {}, {}, {}
    tpot_now = _tpot(classes, pool, shape, pool.ready)
    for c in classes:
        hi = [works[o.name] for o in classes if o.tier < c.tier]
        same = [works[o.name] for o in classes if o.tier == c.tier]
        share, share_late, last, left = _ttft_share(
            c, works[c.name], hi, same, pool, serving, shape, horizon_s
        )
        tpot_ok = tpot * _tpot_calibration(c, tpot_now) <= c.tpot_target_s
        attainment[c.name] = share if tpot_ok else 0.0
        late[c.name] = share_late if tpot_ok else 0.0
        ttft[c.name] = last
        backlog[c.name] = left
    return Prediction(n, attainment, ttft, tpot, late, backlog)


def catch_up(
    classes: Sequence[ClassLoad], pool: PoolState, shape: ReplicaShape, horizon_s: float, over_share: bool
) -> int:
    """Replicas that serve the within-share arrival rate at the horizon's end and clear, in the time
    left after one start, the backlog the current count would leave by then."""
    works = [_work(c, over_share) for c in classes]
    serving = serving_curve(pool, pool.ready + pool.starting)
    start = min(pool.start_time_s, horizon_s)
    q, dt = sum(_seconds(w, shape) for w in works), start / STEPS
    for i in range(STEPS):
        t = i * dt
        q = max(0.0, q + (_load(works, shape, t, pool.start_time_s) - serving(t)) * dt)
    rest = max(horizon_s - start, dt, 1.0)
    return math.ceil(_load(works, shape, horizon_s, pool.start_time_s) + q / rest - 1e-9)


def _work(c: ClassLoad, over_share: bool) -> Work:
    return c.within.plus(c.over) if over_share else c.within


def _seconds(w: Work, shape: ReplicaShape) -> float:
    """Replica-seconds the waiting requests of ``w`` need."""
    if w.waiting_requests <= 0:
        return 0.0
    prompt = w.waiting_prompt_tokens / w.waiting_requests
    output = w.waiting_output_tokens / w.waiting_requests
    return w.waiting_requests * shape.request_s(prompt, output)


def _rate(w: Work, t: float, trend_s: float) -> float:
    """The rate at ``t``: the trend runs on for ``trend_s`` (one start time), then holds, so a noisy
    slope is not carried over the whole horizon."""
    return max(0.0, w.rate_rps + w.rate_slope * min(t, trend_s))


def _load(ws: Sequence[Work], shape: ReplicaShape, t: float, trend_s: float) -> float:
    """Replica-seconds per second arriving at ``t``."""
    return sum(_rate(w, t, trend_s) * shape.request_s(w.mean_prompt_tokens, w.mean_output_tokens) for w in ws)


def _ttft_share(
    c: ClassLoad,
    own: Work,
    hi: Sequence[Work],
    same: Sequence[Work],
    pool: PoolState,
    serving: Callable[[float], float],
    shape: ReplicaShape,
    horizon_s: float,
) -> tuple[float, float, float, float]:
    """(share of the class's requests meeting TTFT, the same from one start time on, predicted TTFT
    of its last arrival, replica-seconds of its tier's and more urgent work left at the horizon)."""
    if not own.active:
        return 1.0, 1.0, 0.0, 0.0
    dt = horizon_s / STEPS
    total_steps = STEPS + int(c.ttft_target_s / dt) + 2  # the last arrivals' service runs past it
    q_hi, q_k = sum(_seconds(w, shape) for w in hi), sum(_seconds(w, shape) for w in same)
    q_hi0, q_k0 = q_hi, q_k
    left = [0.0]  # cumulative capacity left by more urgent work, at each grid point
    ahead = []  # work ahead of an arrival at each grid point of the horizon
    left_at_horizon = 0.0
    for i in range(total_steps):
        t = i * dt
        if i < STEPS:
            ahead.append(q_hi + q_k)
        elif i == STEPS:
            left_at_horizon = q_hi + q_k
        cap, hi_in = serving(t) * dt, _load(hi, shape, t, pool.start_time_s) * dt
        used_hi = min(cap, q_hi + hi_in)
        q_hi += hi_in - used_hi
        q_k = max(0.0, q_k + _load(same, shape, t, pool.start_time_s) * dt - (cap - used_hi))
        left.append(left[-1] + max(0.0, cap - hi_in))
    base = shape.first_token_s(own.mean_prompt_tokens or _mean_prompt(own))
    base += _ttft_calibration(c, base, q_hi0 + q_k0, pool, _load(hi, shape, 0.0, pool.start_time_s))
    budget = c.ttft_target_s - base
    met_waiting = 0.0
    if own.waiting_requests > 0 and budget > 0:
        # the tier's waiting requests are served in fair-share order, interleaved: the class's share
        # meeting the target is the share of the tier's waiting work done within the budget
        done = _cumulative(left, dt, budget) - q_hi0
        met_waiting = own.waiting_requests * (min(1.0, max(0.0, done / q_k0)) if q_k0 > EPS else 1.0)
    met = arrivals = met_late = late = 0.0
    last = base
    for i in range(STEPS):
        t = i * dt
        count = _rate(own, t, pool.start_time_s) * dt
        last = _wait(left, dt, i, ahead[i]) + base
        hit = count if last <= c.ttft_target_s else 0.0
        arrivals, met = arrivals + count, met + hit
        if t >= pool.start_time_s:
            late, met_late = late + count, met_late + hit
    total = own.waiting_requests + arrivals
    share = (met_waiting + met) / total if total > 0 else 1.0
    return share, (met_late / late if late > 0 else share), last, left_at_horizon


def _mean_prompt(w: Work) -> float:
    return w.waiting_prompt_tokens / w.waiting_requests if w.waiting_requests > 0 else 0.0


def _cumulative(left: list[float], dt: float, t: float) -> float:
    """Leftover capacity (replica-seconds) from 0 to ``t``, linear between grid points."""
    i = int(t / dt)
    if i + 1 >= len(left):
        return left[-1] + (left[-1] - left[-2]) / dt * (t - (len(left) - 1) * dt)
    return left[i] + (left[i + 1] - left[i]) * (t / dt - i)


def _wait(left: list[float], dt: float, i: int, work: float) -> float:
    """Time from grid point ``i`` until the leftover capacity covers ``work`` (inf if never)."""
    if work <= EPS:
        return 0.0
    start = left[i]
    for j in range(i + 1, len(left)):
        if left[j] - start >= work:
            step = left[j] - left[j - 1]
            frac = (work - (left[j - 1] - start)) / step if step > 0 else 1.0
            return (j - 1 - i + frac) * dt
    return float("inf")


def _ttft_calibration(c: ClassLoad, base: float, ahead_now: float, pool: PoolState, hi_load: float) -> float:
    """The measured TTFT beyond what the model says of now (≥ 0, at most half the target)."""
    if c.measured_ttft_s is None:
        return 0.0
    now = base + ahead_now / max(pool.ready - hi_load, EPS) if pool.ready > 0 else base
    return min(max(0.0, c.measured_ttft_s - now), c.ttft_target_s / 2)


def _tpot(classes: Sequence[ClassLoad], pool: PoolState, shape: ReplicaShape, n: int) -> float:
    """TPOT at the batch ``n`` replicas would run: what runs and waits, spread over them."""
    waiting = sum(c.within.waiting_requests + c.over.waiting_requests for c in classes)
    batch = min(shape.batch, max(1.0, (pool.running_requests + waiting) / max(n, 1)))
    rates = [
        (w.rate_rps, w.mean_prompt_tokens + w.mean_output_tokens / 2)
        for c in classes
        for w in (c.within, c.over)
    ]
    total = sum(r for r, _ in rates)
    context = sum(r * ctx for r, ctx in rates) / total if total > 0 else 0.0
    return shape.tpot_s(batch, context)


SLOWDOWN_BOUNDS = (0.5, 20.0)  # a ratio far outside is a stall or noise, not the replicas' speed
MIN_PACED_STEPS = 20  # fewer back-to-back steps say nothing yet: the model stands


def slowdown(pool: PoolState, shape: ReplicaShape) -> float:
    """The replicas' measured step time over the step model's, for the same steps: the seconds their
    recent back-to-back steps took over what the model prices those steps at (the model is linear, so
    the sums of their decode rows, prefill and context tokens price them exactly). 1 with too few
    steps; within ``SLOWDOWN_BOUNDS``.

    Every time the prediction reads off the model (capacity, first step, TPOT) is scaled by it. The
    model's TPOT alone, calibrated, had left a replica on 0.3 of an H100, priced by the whole-H200
    fit, at several times the requests per second it served (the attainment it predicted was 0.53
    above what the clients saw); a request's own TPOT is no measure of it (it carries the prefill
    chunks of the steps it shared, at whatever batch ran then)."""
    p = pool.pace
    if p.steps < MIN_PACED_STEPS or p.period_s <= 0:
        return 1.0
    n = p.steps
    modelled_ms = n * shape.step.step_ms(p.decode_rows / n, p.prefill_tokens / n, p.context_tokens / n)
    if modelled_ms <= 0:
        return 1.0
    low, high = SLOWDOWN_BOUNDS
    return min(high, max(low, p.period_s * 1000.0 / modelled_ms))


def _tpot_calibration(c: ClassLoad, tpot_now: float) -> float:
    """Measured TPOT over the model's TPOT of now, between 0.5 and 3 (1 when unmeasured)."""
    if c.measured_tpot_s is None or tpot_now <= 0:
        return 1.0
    return min(3.0, max(0.5, c.measured_tpot_s / tpot_now))
