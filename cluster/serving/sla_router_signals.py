"""A router's part of the SLA policy's inputs: per model on ``autoscaling.policy: sla``, its class loads.

Every monitor poll (``load_poll_interval_s``) the router notes each request it has seen arrive in
the last ``window_s``: those waiting in the model's fair queue (their arrival, prompt and
max_tokens) and those that ended (the timing records, newest first, for requests dispatched before a
poll saw them wait; their output stands in for max_tokens). Per tenant that gives the rate and its
trend (``sla_rate``: over the span its arrivals cover, beyond Poisson noise), the fair-share demand
(the window's arrivals, plus what still waits from before it) and the mean lengths; the queue gives
what waits now.
``sla_share.class_loads`` splits them by fair share at the bound, with the median TTFT and TPOT of
the class's requests that ended in the window; the result goes on the board (``sla_board.py``).

A request dispatched and still running when it was never seen waiting is counted once it ends: under
load requests wait in the queue, so the rates lag only while there is room. With several routers
each sees its own part of a tenant's demand, so the split by share is per router.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from cluster.serving.sla_capacity import ReplicaShape
from cluster.serving.sla_policy import SlaPolicyConfig, bound
from cluster.serving.sla_rate import rate_trend
from cluster.serving.sla_share import TenantLoad, class_loads
from cluster.serving.sla_signals import ClassLoad
from cluster.telemetry.request_timing import RequestTiming
from tenancy import QueuedRequest, TenancyConfig


@dataclass(frozen=True, slots=True)
class Seen:
    tenant_id: str
    arrival: float
    prompt: int
    output: int


class ArrivalLog:
    """Requests seen arriving in the last ``window_s`` (monotonic seconds), by request id."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._seen: dict[str, Seen] = {}

    def note(self, waiting: Iterable[QueuedRequest], ended: Iterable[RequestTiming], now: float) -> None:
        cutoff = now - self.window_s
        for q in waiting:
            if q.request_id not in self._seen and q.arrival >= cutoff:
                self._seen[q.request_id] = Seen(q.tenant_id, q.arrival, q.prompt_tokens, q.max_tokens)
        for t in ended:
            if t.request_id not in self._seen and t.arrival >= cutoff:
                self._seen[t.request_id] = Seen(t.tenant_id, t.arrival, t.prompt_tokens, t.output_tokens)
        self._seen = {k: v for k, v in self._seen.items() if v.arrival >= cutoff}

    def tenants(
        self, waiting: Sequence[QueuedRequest], tenancy: TenancyConfig, now: float
    ) -> list[TenantLoad]:
        w = self.window_s
        by: dict[str, list[Seen]] = {}
        for s in self._seen.values():
            by.setdefault(s.tenant_id, []).append(s)
        queued: dict[str, list[QueuedRequest]] = {}
        for q in waiting:
            queued.setdefault(q.tenant_id, []).append(q)
        out = []
        for tid in by.keys() | queued.keys():
            tenant = tenancy.tenants_by_id.get(tid)
            if tenant is None:  # removed by a reload while its requests ran
                continue
            seen, q = by.get(tid, []), queued.get(tid, [])
            # Work still waiting that arrived before the window asks to be served now as much as
            # the window's arrivals do: without it, a flood whose arrivals left the window had no
            # demand, so all of its backlog counted within share and bought replicas.
            backlog = sum(r.prompt_tokens + 2 * r.max_tokens for r in q if r.arrival < now - w)
            n = max(len(seen), 1)
            trend = rate_trend([s.arrival for s in seen], now, w)
            out.append(
                TenantLoad(
                    tid,
                    tenant.sla_class,
                    tenant.weight,
                    demand=(sum(s.prompt + 2 * s.output for s in seen) + backlog) / w,
                    rate_rps=trend.rate_rps,
                    rate_slope=trend.slope,
                    mean_prompt_tokens=sum(s.prompt for s in seen) / n,
                    mean_output_tokens=sum(s.output for s in seen) / n,
                    waiting_requests=len(q),
                    waiting_prompt_tokens=sum(r.prompt_tokens for r in q),
                    waiting_output_tokens=sum(r.max_tokens for r in q),
                    window_rate_rps=trend.window_rate_rps,
                    trend_rps=trend.trend_rps,
                    slope_var=trend.slope_var,
                )
            )
        return out


def recent(records: Sequence[RequestTiming], since: float) -> list[RequestTiming]:
    """Records that ended at or after ``since`` (records are kept in order of their end)."""
    out = []
    for t in reversed(records):
        if t.end is None or t.end < since:
            break
        out.append(t)
    return out


def measured(ended: Iterable[RequestTiming]) -> dict[str, tuple[float | None, float | None]]:
    """Per class: median TTFT and TPOT of the requests that ended well."""
    ttft: dict[str, list[float]] = {}
    tpot: dict[str, list[float]] = {}
    for t in ended:
        if t.outcome == "ok" and t.ttft is not None:
            ttft.setdefault(t.sla_class, []).append(t.ttft)
            if t.tpot is not None:
                tpot.setdefault(t.sla_class, []).append(t.tpot)
    classes = ttft.keys() | tpot.keys()
    return {c: (_median(ttft.get(c)), _median(tpot.get(c))) for c in classes}


def _median(xs: list[float] | None) -> float | None:
    return statistics.median(xs) if xs else None


def router_loads(
    log: ArrivalLog,
    model: str,
    waiting: Sequence[QueuedRequest],
    records: Sequence[RequestTiming],
    tenancy: TenancyConfig,
    shape: ReplicaShape,
    policy: SlaPolicyConfig,
    goals: dict[str, float],
    now: float | None = None,
    share_basis: str = "active",
) -> list[ClassLoad]:
    """This router's class loads for ``model`` (what it publishes)."""
    now = time.monotonic() if now is None else now
    ended = [t for t in recent(records, now - log.window_s) if t.model in (model, "")]
    log.note(waiting, ended, now)
    tenants = log.tenants(waiting, tenancy, now)
    rate = sum(t.rate_rps for t in tenants)
    prompt = sum(t.mean_prompt_tokens * t.rate_rps for t in tenants) / rate if rate else 256.0
    output = sum(t.mean_output_tokens * t.rate_rps for t in tenants) / rate if rate else 256.0
    capacity = bound(policy) * shape.work_tokens_per_s(prompt, output)
    targets = [
        ClassLoad(c.name, c.priority_tier, c.ttft_target_s, c.tpot_target_s, goals.get(c.name, 0.99))
        for c in tenancy.sla_classes
    ]
    configured = sum(t.weight for t in tenancy.tenants) if share_basis == "configured" else None
    return class_loads(tenants, capacity, targets, measured(ended), configured)


def as_payload(loads: Sequence[ClassLoad], batch: int, price: float) -> dict:
    """The board's JSON form of a router's signals."""
    return {"classes": [asdict(c) for c in loads], "batch": batch, "price": price}
