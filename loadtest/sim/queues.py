"""The waiting-queue disciplines compared: the real ``tenancy.FairQueue`` (with or without SLA
tiers) and a first-come-first-served baseline with the same interface and bounds.

``FifoQueue`` is a baseline, not fairlane code: it implements only what
``cluster.routing.dispatcher.Dispatcher`` calls (push, peek_next, pop_next, remove, counter, charge,
``in``, ``len``), so the same real dispatcher drives every discipline.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import replace

from tenancy import (
    FairQueue,
    FairShareSettings,
    QueuedRequest,
    QueueFull,
    TenancyConfig,
    policies_from_config,
)
from tenancy.queued_request import TenantPolicy


class FifoQueue:
    """Arrival order across all tenants; the same per-tenant and total bounds as ``FairQueue``."""

    def __init__(
        self, policies: Mapping[str, TenantPolicy], settings: FairShareSettings, clock: Callable[[], float]
    ) -> None:
        self._policies = dict(policies)
        self._settings = settings
        self._clock = clock
        self._items: OrderedDict[str, QueuedRequest] = OrderedDict()
        self._per_tenant: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._items

    def make_request(
        self,
        request_id: str,
        tenant_id: str,
        prompt_tokens: int,
        max_tokens: int,
        arrival: float | None = None,
    ) -> QueuedRequest:
        p = self._policies[tenant_id]
        now = self._clock() if arrival is None else arrival
        return QueuedRequest(
            request_id, tenant_id, p.sla_class, p.tier, prompt_tokens, max_tokens, now, now + p.ttft_target_s
        )

    def push(self, request: QueuedRequest) -> None:
        depth = self._per_tenant.get(request.tenant_id, 0)
        if depth >= self._settings.max_queue_per_tenant:
            raise QueueFull(request.tenant_id, "tenant", self._settings.max_queue_per_tenant)
        if len(self._items) >= self._settings.max_queue_total:
            raise QueueFull(request.tenant_id, "total", self._settings.max_queue_total)
        self._items[request.request_id] = request
        self._per_tenant[request.tenant_id] = depth + 1

    def peek_next(self, now: float | None = None) -> QueuedRequest | None:
        return next(iter(self._items.values()), None)

    def pop_next(self, capacity: int | None = None, now: float | None = None) -> QueuedRequest | None:
        head = self.peek_next()
        if head is None or (capacity is not None and head.size > capacity):
            return None
        return self.remove(head.request_id)

    def remove(self, request_id: str) -> QueuedRequest | None:
        request = self._items.pop(request_id, None)
        if request is not None:
            self._per_tenant[request.tenant_id] -= 1
        return request

    def counter(self, tenant_id: str) -> float:
        return 0.0

    def charge(self, tenant_id: str, output_tokens: int) -> None:
        return None


def flat_policies(policies: Mapping[str, TenantPolicy]) -> dict[str, TenantPolicy]:
    """Plain VTC: every tenant in one tier and no class may jump the queue (weights kept)."""
    return {tid: replace(p, tier=0, may_preempt=False) for tid, p in policies.items()}


def make_queue(discipline: str, config: TenancyConfig, clock: Callable[[], float]):
    """``fifo`` | ``vtc`` (real FairQueue, flat tiers) | ``fair_sla`` (real FairQueue as configured)."""
    policies = policies_from_config(config)
    if discipline == "fifo":
        return FifoQueue(policies, config.fair_share, clock)
    if discipline == "vtc":
        return FairQueue(flat_policies(policies), config.fair_share, clock)
    if discipline == "fair_sla":
        return FairQueue(policies, config.fair_share, clock)
    raise ValueError(f"unknown queue discipline {discipline!r}")
