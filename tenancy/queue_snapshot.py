"""Read-only views of the fair queue for metrics."""

from __future__ import annotations

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
