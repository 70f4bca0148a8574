"""Which waiting work is within its tenant's fair share, per SLA class (the policy's ``Work`` parts).

A tenant's demand is its recent arrivals' fair-share work, ``Σ (prompt + 2 × max_tokens)`` per
second (the fair queue's charge), its waiting work from before the window counted as if it had just
come (a backlog still asks to be served: a flood stays over-share after its arrivals leave the
window). Its fair share is max-min by weight (water-filling) of what the model's replicas serve at
the **bound** (``max_replicas`` and the cost ceiling): the most the platform would buy. A tenant
asking for no more than that is within its share; one asking for more has the fraction ``share /
demand`` of its waiting work and arrivals within, the rest over. So a lone tenant may use the whole
bound, and a flood beyond it is over-share by what exceeds it; the simulator's report
(``loadtest/sim/fair_share.py``) splits tenants the same way, over the whole run. With
``share_basis: configured`` a tenant's share is instead its weight's part of every configured
tenant's weight (a guarantee that tenants who are idle keep): a lone flood is over-share beyond it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cluster.serving.sla_rate import RateTrend, class_rate
from cluster.serving.sla_signals import ClassLoad, Work


@dataclass(frozen=True, slots=True)
class TenantLoad:
    """One tenant's recent arrivals and what it has waiting now."""

    tenant_id: str
    sla_class: str
    weight: float
    demand: float  # fair-share work tokens per second, recent
    rate_rps: float = 0.0
    rate_slope: float = 0.0
    mean_prompt_tokens: float = 0.0
    mean_output_tokens: float = 0.0
    waiting_requests: float = 0.0
    waiting_prompt_tokens: float = 0.0
    waiting_output_tokens: float = 0.0
    window_rate_rps: float = 0.0  # the window's mean (``rate_rps`` is the trend's value now)
    # How ``sla_rate.class_rate`` judges the trend: its part of ``rate_rps`` and its Poisson
    # variance (0: the slope is taken as it is)
    trend_rps: float = 0.0
    slope_var: float = 0.0


def water_level(demand: Sequence[float], weight: Sequence[float], capacity: float) -> float:
    """``λ`` with ``Σ min(demand_i, weight_i·λ) = capacity`` (infinite when every demand fits)."""
    if sum(demand) <= capacity:
        return float("inf")
    order = sorted(range(len(demand)), key=lambda i: demand[i] / weight[i])
    satisfied, rest = 0.0, sum(weight)
    for i in order:
        level = (capacity - satisfied) / rest
        if level <= demand[i] / weight[i]:
            return level
        satisfied, rest = satisfied + demand[i], rest - weight[i]
    return float("inf")


def within_fraction(
    tenants: Sequence[TenantLoad], capacity: float, configured_weight: float | None = None
) -> dict[str, float]:
    """Per tenant: the share of its work within its fair share of ``capacity`` (work tokens/s):
    max-min among the tenants with demand, or, given ``configured_weight`` (the weights of every
    tenant configured on the model), its guaranteed share ``weight / configured_weight``."""
    active = [t for t in tenants if t.demand > 0]
    if configured_weight is not None:
        level = capacity / configured_weight
    else:
        level = water_level([t.demand for t in active], [t.weight for t in active], capacity)
    out = {t.tenant_id: 1.0 for t in tenants}
    for t in active:
        out[t.tenant_id] = min(1.0, t.weight * level / t.demand)
    return out


def class_loads(
    tenants: Sequence[TenantLoad],
    capacity: float,
    targets: Sequence[ClassLoad],
    measured: Mapping[str, tuple[float | None, float | None]] | None = None,
    configured_weight: float | None = None,
) -> list[ClassLoad]:
    """``targets`` (each class's name, tier, targets, goal) with its within- and over-share work;
    ``measured``: class → (recent TTFT, recent TPOT); ``configured_weight``: see ``within_fraction``."""
    frac = within_fraction(tenants, capacity, configured_weight)
    parts: dict[str, tuple[list[tuple[TenantLoad, float]], list[tuple[TenantLoad, float]]]] = {
        c.name: ([], []) for c in targets
    }
    for t in tenants:
        if t.sla_class in parts:
            f = frac[t.tenant_id]
            parts[t.sla_class][0].append((t, f))
            parts[t.sla_class][1].append((t, 1.0 - f))
    out = []
    for c in targets:
        ttft, tpot = (measured or {}).get(c.name, (None, None))
        within, over = parts[c.name]
        out.append(
            ClassLoad(
                c.name,
                c.tier,
                c.ttft_target_s,
                c.tpot_target_s,
                c.goal,
                _sum(within),
                _sum(over),
                ttft,
                tpot,
            )
        )
    return out


def _sum(parts: list[tuple[TenantLoad, float]]) -> Work:
    both = class_rate([(_reading(t), f) for t, f in parts])
    weight = sum(t.rate_rps * f for t, f in parts)

    def mean(attr: str) -> float:
        return sum(getattr(t, attr) * t.rate_rps * f for t, f in parts) / weight if weight > 0 else 0.0

    return Work(
        sum(t.waiting_requests * f for t, f in parts),
        sum(t.waiting_prompt_tokens * f for t, f in parts),
        sum(t.waiting_output_tokens * f for t, f in parts),
        both.rate_rps,
        both.slope,
        mean("mean_prompt_tokens"),
        mean("mean_output_tokens"),
        sum(t.window_rate_rps * f for t, f in parts),
    )


def _reading(t: TenantLoad) -> RateTrend:
    return RateTrend(t.rate_rps, t.rate_slope, t.window_rate_rps, t.trend_rps, t.slope_var)
