"""The three dispatch orderings of the one fair queue: ``fcfs``, ``vtc`` and ``fairlane``.

* ``fcfs``: arrival order across all tenants (the baseline; the dispatcher reserves no room).
* ``vtc``: virtual token counters (smallest weighted service first), one tier, no SLA jumps.
* ``fairlane``: counters within SLA tiers; an at-risk request of a class that may preempt pulls its
  tier ahead (docs/tenancy.md, "Selection rule").

All three run the same ``FairQueue`` code; ``fcfs`` and ``vtc`` see every tenant in one tier that
may not preempt, and ``fcfs`` orders tenants by their oldest request instead of by counter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Literal, get_args

from tenancy.queued_request import TenantPolicy

DispatchPolicy = Literal["fcfs", "vtc", "fairlane"]
DISPATCH_POLICIES: tuple[str, ...] = get_args(DispatchPolicy)
DEFAULT_DISPATCH_POLICY: DispatchPolicy = "fairlane"


def check_dispatch_policy(name: str) -> DispatchPolicy:
    if name not in DISPATCH_POLICIES:
        raise ValueError(f"unknown dispatch policy {name!r}; known: {', '.join(DISPATCH_POLICIES)}")
    return name  # type: ignore[return-value]


def policies_for(order: DispatchPolicy, policies: Mapping[str, TenantPolicy]) -> dict[str, TenantPolicy]:
    """The per-tenant policies as ``order`` sees them: one tier without jumps unless ``fairlane``."""
    if order == "fairlane":
        return dict(policies)
    return {tid: replace(p, tier=0, may_preempt=False) for tid, p in policies.items()}


def orders_by_arrival(order: DispatchPolicy) -> bool:
    return order == "fcfs"
