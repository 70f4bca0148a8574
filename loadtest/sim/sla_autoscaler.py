"""The SLA autoscaling policy (``cluster/serving/sla_policy.py``) on simulated time.

Every ``interval_s`` it reads what the cluster's routers and replicas publish, from the simulation:
per tenant the arrivals of the last ``window_s`` (rate, its trend over the window's two halves, fair-
share demand, mean lengths) and the requests waiting in the router's queue; per class the median
TTFT and TPOT of the requests that ended in the window; the replicas ready and starting, what they
run, and their start time. It splits the work by fair share at the bound (``sla_share.py``), asks
``decide`` and applies the answer through ``DelayGate`` (Serve's delay rule).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cluster.serving.sla_capacity import ReplicaShape
from cluster.serving.sla_policy import DelayGate, SlaPolicyConfig, bound, decide
from cluster.serving.sla_rate import rate_trend
from cluster.serving.sla_share import TenantLoad, class_loads
from cluster.serving.sla_signals import ClassLoad, Decision, PoolState
from loadtest.sim.events import EventLoop
from loadtest.sim.outcomes import OK, Outcomes
from loadtest.sim.pool import ReplicaPool
from loadtest.sim.router import SimRouter
from loadtest.sim.workload import Trace

MEASURE_BACK_S = 120.0  # requests that ended in the window arrived at most this long before it


@dataclass(frozen=True, slots=True)
class SlaSimSettings:
    policy: SlaPolicyConfig
    shape: ReplicaShape
    classes: tuple[ClassLoad, ...]  # names, tiers, targets and goals (no work)
    start_s: float  # the replicas' start time (what they would publish)
    interval_s: float = 5.0
    window_s: float = 60.0
    upscale_delay_s: float = 0.0
    downscale_delay_s: float = 60.0


class SlaAutoscaler:
    def __init__(
        self,
        loop: EventLoop,
        pool: ReplicaPool,
        router: SimRouter,
        trace: Trace,
        outcomes: Outcomes,
        settings: SlaSimSettings,
        keep_running: Callable[[], bool],
    ) -> None:
        self._loop, self._pool, self._router, self._trace = loop, pool, router, trace
        self._outcomes, self._s, self._keep_running = outcomes, settings, keep_running
        self._gate = DelayGate(settings.upscale_delay_s, settings.downscale_delay_s)
        self._ids = [t.id for t in trace.tenants]
        self._weights = np.array([t.weight for t in trace.tenants])
        self._class_names = [t.sla_class for t in trace.tenants]
        self._class_of = np.array(self._class_names)[trace.tenant]
        self._cost = trace.prompt.astype(float) + 2.0 * trace.max_tokens
        self._asked: list[float] = []  # when each starting replica was asked for
        self.decisions: list[tuple[float, int]] = []
        self.reasons: Counter[str] = Counter()
        self.last: Decision | None = None

    def start(self) -> None:
        self._loop.after(self._s.interval_s, self._tick)

    def _tick(self) -> None:
        now = self._loop.now
        loads = class_loads(
            self._tenants(now), self._share_capacity(now), self._s.classes, self._measured(now)
        )
        decision = decide(loads, self._pool_state(now), self._s.shape, self._s.policy)
        self.last = decision
        self.reasons[decision.reason.split(":")[0]] += 1
        target = self._pool.target
        applied = self._gate.apply(decision.desired, target, now)
        if applied != target:
            self._scale(applied, target, now)
        if self._keep_running():
            self._loop.after(self._s.interval_s, self._tick)

    def _scale(self, desired: int, current: int, now: float) -> None:
        if desired > current:
            self._pool.add(desired - current)
            self._asked += [now] * (desired - current)
        else:
            dropped_starting = min(len(self._pool.starting), current - desired)
            self._asked = self._asked[: len(self._asked) - dropped_starting]
            self._pool.remove(current - desired)
        self.decisions.append((now, desired))

    def _pool_state(self, now: float) -> PoolState:
        start = self._s.start_s
        self._asked = self._asked[-len(self._pool.starting) :] if self._pool.starting else []
        left = max((t + start - now for t in self._asked), default=0.0)
        running = sum(r.ongoing for r in self._pool.ready)
        return PoolState(len(self._pool.ready), len(self._pool.starting), max(0.0, left), running, start)

    def _window(self, lo: float, hi: float) -> slice:
        a = self._trace.arrival
        return slice(int(np.searchsorted(a, lo)), int(np.searchsorted(a, hi, side="right")))

    def _tenants(self, now: float) -> list[TenantLoad]:
        t, w, n = self._trace, self._s.window_s, len(self._ids)
        win = self._window(now - w, now)
        who, arrived = t.tenant[win], t.arrival[win]
        count = np.bincount(who, minlength=n)
        demand = np.bincount(who, weights=self._cost[win], minlength=n) / w
        prompt = np.bincount(who, weights=t.prompt[win], minlength=n)
        output = np.bincount(who, weights=t.max_tokens[win], minlength=n)
        waiting = self._waiting(n)
        out = []
        for k in np.flatnonzero((count > 0) | (waiting[0] > 0)):
            c = max(int(count[k]), 1)
            trend = rate_trend(arrived[who == k].tolist(), now, w)  # as the router reads it
            out.append(
                TenantLoad(
                    self._ids[k],
                    self._class_names[k],
                    float(self._weights[k]),
                    float(demand[k]),
                    trend.rate_rps,
                    trend.slope,
                    prompt[k] / c,
                    output[k] / c,
                    float(waiting[0][k]),
                    float(waiting[1][k]),
                    float(waiting[2][k]),
                    trend.window_rate_rps,
                    trend.trend_rps,
                    trend.slope_var,
                )
            )
        return out

    def _waiting(self, n: int) -> np.ndarray:
        """Per tenant: requests, prompt tokens and max_tokens waiting in the router's queue."""
        out = np.zeros((3, n))
        index = {tid: k for k, tid in enumerate(self._ids)}
        for q in self._router._queued.values():
            k = index[q.tenant_id]
            out[0, k] += 1
            out[1, k] += q.prompt_tokens
            out[2, k] += q.max_tokens
        return out

    def _share_capacity(self, now: float) -> float:
        """Fair-share work tokens per second the replicas serve at the bound (recent mean lengths)."""
        win = self._window(now - self._s.window_s, now)
        if win.stop <= win.start:
            return float("inf")
        prompt = float(self._trace.prompt[win].mean())
        output = float(self._trace.max_tokens[win].mean())
        return bound(self._s.policy) * self._s.shape.work_tokens_per_s(prompt, output)

    def _measured(self, now: float) -> dict[str, tuple[float | None, float | None]]:
        """Per class: median TTFT and TPOT of the requests that ended in the window."""
        o, t = self._outcomes, self._trace
        win = self._window(now - self._s.window_s - MEASURE_BACK_S, now)
        end = o.end[win]
        done = (o.status[win] == OK) & (end >= now - self._s.window_s) & (end <= now)
        ttft = o.first_token[win] - t.arrival[win]
        out_n = o.output[win]
        tpot = np.where(out_n > 1, (end - o.first_token[win]) / np.maximum(out_n - 1, 1), np.nan)
        result = {}
        for c in self._s.classes:
            mask = done & (self._class_of[win] == c.name)
            if not mask.any():
                result[c.name] = (None, None)
                continue
            tp = tpot[mask]
            tp = tp[np.isfinite(tp)]
            result[c.name] = (float(np.median(ttft[mask])), float(np.median(tp)) if len(tp) else None)
        return result
