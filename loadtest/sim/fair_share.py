"""Which tenants ask for no more than their fair share of the cluster (max-min fair, by weight).

A tenant's demand is its offered work over the run, ``Σ (prompt + 2 × max_tokens) / duration``
(tokens/s, as the fair queue counts service). The cluster's capacity in the same unit is the
trace's estimated request capacity × the mean offered request cost. Water-filling gives each
tenant ``min(demand, weight × λ)`` with ``λ`` set so the allocations sum to the capacity; a tenant
is **within its share** when its demand is below ``weight × λ`` (it would get all it asks for under
a max-min fair split), **over its share** otherwise. Attainment is reported for both groups: the
fair queue promises the first their SLA and only a weighted share to the second.
"""

from __future__ import annotations

import numpy as np

from loadtest.sim.workload import Trace


def demand_per_s(trace: Trace) -> np.ndarray:
    cost = trace.prompt.astype(float) + 2.0 * trace.max_tokens
    demand = np.bincount(trace.tenant, weights=cost, minlength=len(trace.tenants))
    return demand / max(trace.duration_s, 1e-9)


def capacity_per_s(trace: Trace) -> float:
    if len(trace) == 0:
        return 0.0
    mean_cost = float(np.mean(trace.prompt + 2.0 * trace.max_tokens))
    return trace.capacity_rps * mean_cost


def water_level(demand: np.ndarray, weight: np.ndarray, capacity: float) -> float:
    """``λ`` with ``Σ min(demand, weight·λ) = capacity`` (infinite when every demand fits)."""
    if demand.sum() <= capacity:
        return float("inf")
    order = np.argsort(demand / weight)
    d, w = demand[order], weight[order]
    satisfied = np.concatenate([[0.0], np.cumsum(d)])  # demand of the first k tenants, all met
    rest_weight = np.concatenate([np.cumsum(w[::-1])[::-1], [0.0]])  # weight of tenants k..n-1
    for k in range(len(d)):
        level = (capacity - satisfied[k]) / rest_weight[k]
        if level <= d[k] / w[k]:
            return float(level)
    return float("inf")


def within_share(trace: Trace) -> np.ndarray:
    """Per tenant: True when its demand is below its max-min fair share."""
    demand = demand_per_s(trace)
    weight = np.array([t.weight for t in trace.tenants], dtype=float)
    level = water_level(demand, weight, capacity_per_s(trace))
    return demand < weight * level
