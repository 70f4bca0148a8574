"""The SLA autoscaling decision: pure functions over ``sla_signals``, no Ray.

* **Speed**: the step model's times are scaled by what the replicas' recent steps took over what it
  prices them at (``sla_predict.slowdown``, published with the decision), so capacity is what the
  replicas serve.
* **Up** when a class with within-share work is predicted below its goal at the current count over
  the horizon (``start_time_s + horizon_s``, so the new replica's start is inside it): the smallest
  count, up to the bound, at which every class keeps its goal for the arrivals after that start
  (what a replica asked for now can change). If no count does within the horizon, the count that
  catches up (``sla_predict.catch_up``), where it is more than the current one or some count
  predicts better. If the misses all come before a start, hold: no replica asked for now would
  serve them.
* **Useless** replicas go even while a class misses: when the up rule asks for no more than are
  running, one fewer is let go while it still serves the load (no fewer than ``catch_up``) and its
  prediction (rates raised as for a down) is no worse in any way (every class's attainment, the
  TPOT, each class's TTFT past its target). A miss that no count changes (a TPOT the replicas' own
  speed sets) does not hold replicas at the bound.
* **Down** one replica at a time while every class keeps its goal with one fewer, its arrival rates
  raised by ``down_headroom``, never below the window's mean, and a falling trend not extended (so a
  count does not drop at the edge of what it needs, or on a fall that levels off): to the fewest
  that still keep every goal.
* **Over-share** work (``sla_share.py``) is left out of the prediction unless
  ``scale_for_over_share``: it is served with what within-share work leaves, and never buys a replica.
* **Bound**: ``max_replicas``, and ``max_gpu_dollars_per_hour`` over the replica's price per hour.
* **Delays** belong to whoever applies the decision: Serve's wrapper around a custom policy applies
  ``upscale_delay_s`` / ``downscale_delay_s`` in the cluster; ``DelayGate`` is the same rule for the
  simulator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from cluster.serving.sla_capacity import ReplicaShape
from cluster.serving.sla_predict import catch_up, predict, slowdown
from cluster.serving.sla_signals import ClassLoad, Decision, PoolState, Prediction, Work


@dataclass(frozen=True, slots=True)
class SlaPolicyConfig:
    min_replicas: int = 1
    max_replicas: int = 2
    horizon_s: float = 30.0  # looked ahead beyond one replica start
    scale_for_over_share: bool = False
    max_gpu_dollars_per_hour: float | None = None
    gpu_dollars_per_hour: float = 5.0  # one replica's price (tenancy's gpu_dollars_per_hour)
    down_headroom: float = 0.2


def bound(cfg: SlaPolicyConfig) -> int:
    """The most replicas allowed: ``max_replicas``, and what the cost ceiling buys (never below min)."""
    most = cfg.max_replicas
    if cfg.max_gpu_dollars_per_hour is not None and cfg.gpu_dollars_per_hour > 0:
        most = min(most, math.floor(cfg.max_gpu_dollars_per_hour / cfg.gpu_dollars_per_hour + 1e-9))
    return max(cfg.min_replicas, most)


def meets(p: Prediction, classes: Sequence[ClassLoad], late: bool = False) -> bool:
    """Every class keeps its goal (``late``: over the arrivals after one start time)."""
    got = p.late if late else p.attainment
    return all(got[c.name] >= c.goal for c in classes)


def worst(p: Prediction, classes: Sequence[ClassLoad]) -> tuple[float, str]:
    """The largest shortfall below a goal (≤ 0 when every class keeps it) and its class."""
    return max(((c.goal - p.attainment[c.name], c.name) for c in classes), default=(0.0, ""))


def decide(
    classes: Sequence[ClassLoad], pool: PoolState, shape: ReplicaShape, cfg: SlaPolicyConfig
) -> Decision:
    current, most = pool.ready + pool.starting, bound(cfg)
    horizon = pool.start_time_s + cfg.horizon_s
    shape = replace(shape, slowdown=slowdown(pool, shape))  # the replicas' own speed
    return replace(_decide(classes, pool, shape, cfg, current, most, horizon), slowdown=shape.slowdown)


def _decide(
    classes: Sequence[ClassLoad],
    pool: PoolState,
    shape: ReplicaShape,
    cfg: SlaPolicyConfig,
    current: int,
    most: int,
    horizon: float,
) -> Decision:

    def at(n: int, cls: Sequence[ClassLoad] = classes) -> Prediction:
        return predict(cls, pool, shape, n, horizon, cfg.scale_for_over_share)

    now = at(current)
    if current > most:
        return Decision(
            most, current, f"down to the bound {most} (max_replicas / cost ceiling)", most, (now,)
        )
    if current < cfg.min_replicas:
        return Decision(cfg.min_replicas, current, "up to min_replicas", most, (now,))
    if not meets(now, classes):
        catch = catch_up(classes, pool, shape, horizon, cfg.scale_for_over_share)
        up = _up(classes, current, most, now, at, pool, catch)
        return up if up.desired > current else _shed_useless(classes, current, up, at, cfg, catch)
    if current > cfg.min_replicas:
        return _down(classes, current, most, now, at, cfg)
    return Decision(current, current, "hold: every class keeps its goal at min_replicas", most, (now,))


def _up(classes, current: int, most: int, now: Prediction, at, pool: PoolState, catch: int) -> Decision:
    _, name = worst(now, classes)
    said = f"{name} predicted {now.attainment[name]:.3f} < goal {_goal(classes, name):g} at {current}"
    if meets(now, classes, late=True):
        return Decision(
            current, current, f"hold: {said}, before a replica asked for now could start", most, (now,)
        )
    tried = [now]
    for n in range(current + 1, most + 1):
        p = at(n)
        tried.append(p)
        if meets(p, classes, late=True):
            return Decision(
                n,
                current,
                f"up: {said}; {n} keep every goal once started ({pool.start_time_s:.0f} s)",
                most,
                tuple(tried),
            )
    if catch <= current and all(_no_worse(now, p, classes) for p in tried[1:]):  # none would help
        return Decision(
            current, current, f"hold: {said}; no count up to {most} predicts better", most, tuple(tried)
        )
    n = min(most, max(current + 1, catch))
    verb = "up" if n > current else "hold at the bound"  # the catch-up asks for more than it may
    return Decision(
        n, current, f"{verb}: {said}; no count up to {most} keeps it: {n} catch up", most, tuple(tried)
    )


def _down(classes, current: int, most: int, now: Prediction, at, cfg: SlaPolicyConfig) -> Decision:
    """The fewest replicas, down from ``current`` one at a time, at which every class still keeps its
    goal with the headroom; none fewer: hold."""
    raised = [_raised(c, cfg.down_headroom) for c in classes]
    tried, n = [now], current
    while n > cfg.min_replicas:
        fewer = at(n - 1, raised)
        tried.append(fewer)
        if not meets(fewer, classes):
            break
        n -= 1
    if n < current:
        return Decision(n, current, f"down: every class keeps its goal at {n}", most, tuple(tried))
    short, name = worst(tried[-1], classes)
    reason = f"hold: with one fewer {name} would fall {short:.3f} below its goal"
    return Decision(current, current, reason, most, tuple(tried))


def _shed_useless(classes, current: int, held: Decision, at, cfg: SlaPolicyConfig, catch: int) -> Decision:
    """Down from ``current`` while one fewer replica still serves the load (``catch``, the count
    that catches up) and predicts no worse than ``current`` does; else the up rule's ``held``."""
    now, raised = held.predictions[0], [_raised(c, cfg.down_headroom) for c in classes]
    tried, n = list(held.predictions), current
    while n > max(cfg.min_replicas, catch):
        fewer = at(n - 1, raised)
        if not _no_worse(fewer, now, classes):
            break
        tried.append(fewer)
        n -= 1
    if n == current:
        return held
    _, name = worst(now, classes)
    said = f"{name} predicted {now.attainment[name]:.3f} < goal {_goal(classes, name):g} at {current}"
    reason = f"down: {said}, and {n} predict no worse: the replicas let go bought nothing"
    return Decision(n, current, reason, held.bound, tuple(tried))


def _no_worse(fewer: Prediction, now: Prediction, classes: Sequence[ClassLoad]) -> bool:
    """``fewer`` predicts every class's attainment, the TPOT, each class's TTFT past its target and
    the work it leaves queued at the horizon no worse than ``now``. (The backlog tells two counts
    apart where every request misses at both: under a burst no count can serve, the TTFTs of both
    are past the horizon, yet one fewer replica leaves more of the queue behind.)"""
    if fewer.tpot_s > now.tpot_s * (1 + 1e-6):
        return False
    for c in classes:
        if fewer.attainment[c.name] < now.attainment[c.name] - 1e-9:
            return False
        if fewer.ttft_s[c.name] > max(now.ttft_s[c.name], c.ttft_target_s) + 1e-9:
            return False
        if fewer.backlog_s.get(c.name, 0.0) > now.backlog_s.get(c.name, 0.0) * (1 + 1e-6) + 1e-9:
            return False
    return True


def _goal(classes: Sequence[ClassLoad], name: str) -> float:
    return next(c.goal for c in classes if c.name == name)


def _raised(c: ClassLoad, headroom: float) -> ClassLoad:
    def up(w: Work) -> Work:  # a falling rate is not counted on: it may turn, or level off
        rate = max(w.rate_rps, w.window_rate_rps)
        return replace(w, rate_rps=rate * (1 + headroom), rate_slope=max(0.0, w.rate_slope))

    return replace(c, within=up(c.within), over=up(c.over))


@dataclass(slots=True)
class DelayGate:
    """Serve's rule for applying a custom policy's decisions (``upscale_delay_s``,
    ``downscale_delay_s``): a change is applied once it has been asked for, in the same direction,
    for that long; a decision the other way (or none) restarts the wait. For the simulator."""

    upscale_delay_s: float
    downscale_delay_s: float
    _direction: int = 0
    _since: float | None = None

    def apply(self, desired: int, target: int, now: float) -> int:
        direction = (desired > target) - (desired < target)
        if direction == 0:
            self._direction, self._since = 0, None
            return target
        if direction != self._direction or self._since is None:
            self._direction, self._since = direction, now
        delay = self.upscale_delay_s if direction > 0 else self.downscale_delay_s
        if now - self._since + 1e-6 >= delay:
            self._direction, self._since = 0, None
            return desired
        return target
