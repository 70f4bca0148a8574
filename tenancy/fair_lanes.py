"""The fair queue's inner structures: a lane per tenant, and per tier two heaps with lazy deletion.

``Tier.by_order`` holds ``(key, head seq, lane version, tenant)`` for every backlogged lane (key:
its counter, or its head's arrival sequence for ``fcfs``); ``Tier.by_risk`` holds ``(at-risk time,
head seq, tenant)`` for lanes whose class may preempt. An entry is stale once its lane changed
(version) or its head left; stale entries are dropped when they reach the top, and a heap is
rebuilt when they pile up.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tenancy.queued_request import QueuedRequest, TenantPolicy

Eligible = Callable[[str], bool]
OrderEntry = tuple[float, int, int, str]
RiskEntry = tuple[float, int, str]


@dataclass(slots=True)
class Entry:
    seq: int
    request: QueuedRequest
    at_risk_at: float
    fresh: bool = False  # made its lane backlogged (the tenant returned from idle)


@dataclass(slots=True)
class Lane:
    tenant_id: str
    policy: TenantPolicy
    counter: float = 0.0
    offset: float = 0.0  # the part of the counter lifts made (counter − growth), shared by maximum
    version: int = 0
    queue: deque[Entry] = field(default_factory=deque)


@dataclass(slots=True)
class Tier:
    tier: int
    floor: float = 0.0
    backlogged: int = 0
    by_order: list[OrderEntry] = field(default_factory=list)
    by_risk: list[RiskEntry] = field(default_factory=list)


class TierHeaps:
    """Heap reads and upkeep over the lanes of a queue."""

    def __init__(self, lanes: dict[str, Lane]) -> None:
        self._lanes = lanes

    def publish(self, tier: Tier, lane: Lane, key: float) -> None:
        """Push fresh entries for a backlogged lane whose key or head changed."""
        lane.version += 1
        head = lane.queue[0]
        heapq.heappush(tier.by_order, (key, head.seq, lane.version, lane.tenant_id))
        if lane.policy.may_preempt:
            heapq.heappush(tier.by_risk, (head.at_risk_at, head.seq, lane.tenant_id))
        if len(tier.by_order) > 4 * tier.backlogged + 64:
            self._compact(tier)

    def top(self, tier: Tier, eligible: Eligible | None = None) -> OrderEntry | None:
        """The first valid entry whose tenant is eligible (ineligible ones stay in the heap)."""
        return _first(tier.by_order, self._order_valid, _tenant_of_order, eligible)

    def at_risk(self, tier: Tier, now: float, eligible: Eligible | None = None) -> bool:
        found = _first(tier.by_risk, self._risk_valid, _tenant_of_risk, eligible)
        return found is not None and found[0] <= now

    def fresh_top(self, tier: Tier, eligible: Eligible | None = None) -> bool:
        """The tier's next pick is a tenant that just returned from idle, in a class that may preempt."""
        top = self.top(tier, eligible)
        if top is None:
            return False
        lane = self._lanes[top[3]]
        return lane.policy.may_preempt and lane.queue[0].fresh

    def _order_valid(self, entry: OrderEntry) -> bool:
        lane = self._lanes[entry[3]]
        return lane.version == entry[2] and bool(lane.queue)

    def _risk_valid(self, entry: RiskEntry) -> bool:
        lane = self._lanes[entry[2]]
        return bool(lane.queue) and lane.queue[0].seq == entry[1]

    def _compact(self, tier: Tier) -> None:
        tier.by_order = [e for e in tier.by_order if self._order_valid(e)]
        tier.by_risk = [e for e in tier.by_risk if self._risk_valid(e)]
        heapq.heapify(tier.by_order)
        heapq.heapify(tier.by_risk)


def _tenant_of_order(entry: OrderEntry) -> str:
    return entry[3]


def _tenant_of_risk(entry: RiskEntry) -> str:
    return entry[2]


def _first(heap: list, valid: Callable, tenant_of: Callable[..., str], eligible: Eligible | None):
    """Drop stale entries from the top; set aside valid ineligible ones and put them back after."""
    skipped = []
    found = None
    while heap:
        entry = heap[0]
        if not valid(entry):
            heapq.heappop(heap)
        elif eligible is not None and not eligible(tenant_of(entry)):
            skipped.append(heapq.heappop(heap))
        else:
            found = entry
            break
    for entry in skipped:
        heapq.heappush(heap, entry)
    return found
