"""Read-only views of the fair queue for metrics."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TenantQueueStats:
    """One tenant's virtual token counter (service / weight) and waiting requests."""

    tenant_id: str
    counter: float
    queued: int
    weight: float
    tier: int
    sla_class: str


@dataclass(frozen=True, slots=True)
class FairQueueSnapshot:
    """Per-tenant counters and queue depths by tenant, SLA class and tier."""

    tenants: dict[str, TenantQueueStats]
    depth_by_class: dict[str, int]
    depth_by_tier: dict[int, int]
    total: int

    @classmethod
    def of(
        cls, stats: Iterable[TenantQueueStats], classes: Iterable[str], tiers: Iterable[int], total: int
    ) -> FairQueueSnapshot:
        tenants = {s.tenant_id: s for s in stats}
        by_class = dict.fromkeys(classes, 0)
        by_tier = dict.fromkeys(tiers, 0)
        for s in tenants.values():
            by_class[s.sla_class] += s.queued
            by_tier[s.tier] += s.queued
        return cls(tenants, by_class, by_tier, total)
