"""Which tenants of a load test asked for no more than their max-min fair share (issue 23 item 4).

The simulator's definition (``loadtest/sim/fair_share.py``, whose water-filling this module calls,
so the two agree): a tenant's demand is its offered work over the run,
``Σ (prompt + 2 × max_tokens) / duration`` in the fair queue's unit; the cluster's capacity in the
same unit is its output tokens/s × the offered requests' mean cost per output token asked for
(the simulator's request capacity × mean cost). Water-filling by weight gives each tenant
``min(demand, weight × λ)``; a tenant is **within its share** when its demand is below
``weight × λ``, **over** it otherwise. The fair queue promises the first their SLA and the second
only a weighted share, so attainment is reported for both groups apart.

A request refused before its first token has no prompt count from the server; it is costed at
its tenant's mean prompt among the requests that have one (the offered work, not the served).
Without a known capacity (``capacity_output_tps``) the run's own output throughput stands in: an
overloaded run serves at capacity, an underloaded one then counts every tenant within its share.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from loadtest.metrics import group_metrics
from loadtest.records import RequestRecord
from loadtest.sim.fair_share import water_level
from tenancy import SLAClass

CAPACITY_GIVEN = "given (capacity_output_tps)"
CAPACITY_MEASURED = "the run's output throughput (no capacity given; equal to it only when overloaded)"


def offered_cost(records: Sequence[RequestRecord]) -> dict[str, float]:
    """Per tenant: Σ (prompt + 2 × max_tokens) over every request offered (warm-up included)."""
    prompts: dict[str, list[int]] = {}
    for r in records:
        if r.prompt_tokens > 0:
            prompts.setdefault(r.tenant, []).append(r.prompt_tokens)
    mean_prompt = {t: float(np.mean(v)) for t, v in prompts.items()}
    cost: dict[str, float] = {}
    for r in records:
        prompt = r.prompt_tokens if r.prompt_tokens > 0 else mean_prompt.get(r.tenant, 0.0)
        cost[r.tenant] = cost.get(r.tenant, 0.0) + prompt + 2.0 * r.max_tokens
    return cost


def capacity_cost_per_s(records: Sequence[RequestRecord], capacity_output_tps: float) -> float:
    """The capacity in the fair queue's unit: output tok/s × offered cost per output token asked."""
    asked = sum(r.max_tokens for r in records)
    total = sum(offered_cost(records).values())
    return capacity_output_tps * total / asked if asked else 0.0


def share_split(
    records: Sequence[RequestRecord], duration_s: float, capacity_output_tps: float | None
) -> dict:
    """Per tenant demand, fair share and within/over, with the capacity used and where it came from."""
    tenants = sorted({r.tenant for r in records})
    if not tenants:
        return {"capacity_output_tps": capacity_output_tps, "tenants": {}}
    source = CAPACITY_GIVEN
    if capacity_output_tps is None:
        source = CAPACITY_MEASURED
        capacity_output_tps = _served_output_tps(records)
    cost = offered_cost(records)
    weight = {r.tenant: r.weight for r in records}
    demand = np.array([cost[t] / max(duration_s, 1e-9) for t in tenants])
    weights = np.array([weight[t] for t in tenants])
    capacity = capacity_cost_per_s(records, capacity_output_tps)
    level = water_level(demand, weights, capacity)
    out = {}
    for t, d, w in zip(tenants, demand, weights, strict=True):
        share = None if np.isinf(level) else float(w * level)
        out[t] = {"demand_per_s": float(d), "weight": float(w), "share_per_s": share,
                  "within_share": bool(share is None or d < share)}  # fmt: skip
    return {
        "capacity_output_tps": float(capacity_output_tps),
        "capacity_source": source,
        "capacity_per_s": capacity,
        "offered_over_capacity": float(demand.sum() / capacity) if capacity > 0 else None,
        "tenants": out,
    }


def _served_output_tps(records: Sequence[RequestRecord]) -> float:
    ok = [r for r in records if r.ok and r.end is not None]
    if not ok:
        return 0.0
    span = max(r.end for r in ok) - min(r.sent for r in ok)  # type: ignore[type-var]
    return sum(r.output_tokens for r in ok) / max(span, 1e-9)


def attainment_by_share(
    measured: Sequence[RequestRecord], classes: dict[str, SLAClass], within: dict[str, bool], span_s: float
) -> dict:
    """Per SLA class, the metrics of its within-share tenants' requests and of its over-share ones:
    ``group_metrics``' keys, so each side has ``ttft_attainment``, ``tpot_attainment``, the whole
    SLA (``sla_attainment`` of served, ``attainment_all`` of offered) and ``cut`` beside them."""
    out: dict[str, dict] = {}
    for name in sorted({r.sla_class for r in measured}):
        of_class = [r for r in measured if r.sla_class == name]
        groups = {"within": [r for r in of_class if within.get(r.tenant, True)]}
        groups["over"] = [r for r in of_class if not within.get(r.tenant, True)]
        out[name] = {
            side: {"tenants": sorted({r.tenant for r in rs})} | group_metrics(rs, classes, span_s)
            for side, rs in groups.items()
            if rs
        }
    return out
