"""Weighted fair queue across tenants: virtual token counters (VTC) plus SLA-tier deadlines.

Rule (docs/tenancy.md proves the fairness bound):

* Each tenant has a counter ``c = service / weight``; service is ``prompt tokens × 1`` charged at
  dispatch and ``output tokens × 2`` charged as produced (``charge``).
* A tenant that becomes backlogged (its queue was empty) is lifted: ``c = max(c, L)`` with ``L``
  the smallest counter among backlogged tenants of its tier, or, when its tier has none, the
  larger of the tier's floor and the smallest counter among all backlogged tenants. Idle time
  banks no credit.
* A request is *at risk* when ``now >= deadline - (margin_s + margin_fraction × TTFT target)``.
  Let ``k*`` be the most urgent tier (smallest number) whose class may preempt lower tiers and
  that has an at-risk head-of-line request. Candidates are the backlogged tenants of tiers
  ``<= k*``; without such a tier, all backlogged tenants.
* The next request is the oldest one of the candidate tenant with the smallest counter (ties:
  more urgent tier, then older head). If it does not fit ``capacity``, nothing is popped.

Every dispatch thus goes to the smallest counter of its own tier, which is all the VTC bound
needs, so fairness among tenants of one tier holds whatever the deadlines do.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tenancy.config import FairShareSettings, TenancyConfig
from tenancy.errors import InvalidQueueItem, QueueFull, UnknownTenantError
from tenancy.queue_snapshot import FairQueueSnapshot, TenantQueueStats
from tenancy.queued_request import QueuedRequest, TenantPolicy, policies_from_config

INPUT_TOKEN_COST = 1.0
OUTPUT_TOKEN_COST = 2.0


@dataclass(slots=True)
class _Entry:
    seq: int
    request: QueuedRequest
    at_risk_at: float


@dataclass(slots=True)
class _Lane:
    tenant_id: str
    policy: TenantPolicy
    counter: float = 0.0
    version: int = 0
    queue: deque[_Entry] = field(default_factory=deque)


@dataclass(slots=True)
class _Tier:
    tier: int
    floor: float = 0.0
    backlogged: int = 0
    by_counter: list[tuple[float, int, int, str]] = field(default_factory=list)
    by_risk: list[tuple[float, int, str]] = field(default_factory=list)


class FairQueue:
    """Waiting requests of all tenants, popped in weighted-fair, SLA-aware order. Not thread-safe."""

    def __init__(
        self,
        policies: Mapping[str, TenantPolicy],
        settings: FairShareSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._policies = dict(policies)
        self._settings = settings or FairShareSettings()
        self._clock = clock
        self._lanes: dict[str, _Lane] = {}
        self._tiers: dict[int, _Tier] = {p.tier: _Tier(p.tier) for p in self._policies.values()}
        self._tier_order = sorted(self._tiers)
        self._index: dict[str, _Entry] = {}
        self._seq = itertools.count()
        self._local_service: dict[str, float] = {}  # counter growth charged here, not yet shared

    @classmethod
    def from_config(cls, config: TenancyConfig, clock: Callable[[], float] = time.monotonic) -> FairQueue:
        return cls(policies_from_config(config), config.fair_share, clock)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._index

    def make_request(
        self,
        request_id: str,
        tenant_id: str,
        prompt_tokens: int,
        max_tokens: int,
        arrival: float | None = None,
    ) -> QueuedRequest:
        """A queue item for ``tenant_id``, its class, tier and deadline filled in from the policy."""
        policy = self._policy(tenant_id)
        now = self._clock() if arrival is None else arrival
        return QueuedRequest(
            request_id,
            tenant_id,
            policy.sla_class,
            policy.tier,
            prompt_tokens,
            max_tokens,
            now,
            now + policy.ttft_target_s,
        )

    def push(self, request: QueuedRequest, lift: bool = True) -> None:
        """Enqueue; raises ``QueueFull`` when a bound is reached, ``InvalidQueueItem`` for bad items.

        ``lift=False``: the tenant was backlogged already (a request carried over by ``carry_from``),
        so its counter stays as it was instead of being lifted as if it returned from idle.
        """
        lane = self._lane(request.tenant_id)
        self._validate(request, lane)
        if len(lane.queue) >= self._settings.max_queue_per_tenant:
            raise QueueFull(request.tenant_id, "tenant", self._settings.max_queue_per_tenant)
        if len(self._index) >= self._settings.max_queue_total:
            raise QueueFull(request.tenant_id, "total", self._settings.max_queue_total)
        entry = _Entry(next(self._seq), request, self._at_risk_at(request))
        self._index[request.request_id] = entry
        lane.queue.append(entry)
        if len(lane.queue) == 1:
            if lift:
                self._lift(lane)
            self._tiers[lane.policy.tier].backlogged += 1
            self._publish(lane)

    def peek_next(self, now: float | None = None) -> QueuedRequest | None:
        """The request ``pop_next`` would return given enough capacity, without removing it."""
        lane = self._choose(self._clock() if now is None else now)
        return None if lane is None else lane.queue[0].request

    def pop_next(self, capacity: int | None = None, now: float | None = None) -> QueuedRequest | None:
        """Remove and return the next request, or None when empty or when it exceeds ``capacity``.

        ``capacity`` is the tokens (prompt + max output) the chosen replica can take; None means
        unbounded. A None return with a non-empty queue means the fair choice does not fit: other
        tenants are not served past it (that would break the fairness bound).
        """
        lane = self._choose(self._clock() if now is None else now)
        if lane is None:
            return None
        head = lane.queue[0]
        if capacity is not None and head.request.size > capacity:
            return None
        lane.queue.popleft()
        del self._index[head.request.request_id]
        tier = self._tiers[lane.policy.tier]
        tier.floor = max(tier.floor, lane.counter)
        self._grow(lane, INPUT_TOKEN_COST * head.request.prompt_tokens / lane.policy.weight)
        self._after_head_change(lane)
        return head.request

    def charge(self, tenant_id: str, output_tokens: int) -> None:
        """Charge output tokens as they are produced (weighted, ×2); a tenant that a reload removed
        is not charged (its requests in flight finish; nothing waits behind its counter)."""
        if output_tokens < 0:
            raise ValueError("output_tokens must be >= 0")
        if tenant_id not in self._policies:
            return
        lane = self._lane(tenant_id)
        self._grow(lane, OUTPUT_TOKEN_COST * output_tokens / lane.policy.weight)
        if lane.queue:
            self._publish(lane)

    def credit(self, tenant_id: str, counter_delta: float) -> None:
        """Add counter growth that another router charged (already divided by the weight)."""
        if counter_delta <= 0 or tenant_id not in self._policies:
            return
        lane = self._lane(tenant_id)
        lane.counter += counter_delta
        if lane.queue:
            self._publish(lane)

    def carry_from(self, old: FairQueue) -> None:
        """Take over ``old``'s counters and unshared service (tenants that still exist) and tier floors
        (tiers that still exist): a reloaded config neither forgives service nor forgets it."""
        for tenant_id, lane in old._lanes.items():
            if tenant_id in self._policies:
                self._lane(tenant_id).counter = lane.counter
        for number, tier in old._tiers.items():
            if number in self._tiers:
                self._tiers[number].floor = tier.floor
        self._local_service = {t: s for t, s in old._local_service.items() if t in self._policies}

    def waiting(self) -> list[QueuedRequest]:
        """The waiting requests, oldest first."""
        return [entry.request for entry in self._index.values()]

    def take_local_service(self) -> dict[str, float]:
        """Counter growth charged by this queue since the last call, per tenant (to share it)."""
        taken, self._local_service = self._local_service, {}
        return taken

    def remove(self, request_id: str) -> QueuedRequest | None:
        """Drop a waiting request (client gone); None if it is not waiting (already popped or unknown)."""
        entry = self._index.pop(request_id, None)
        if entry is None:
            return None
        lane = self._lanes[entry.request.tenant_id]
        was_head = lane.queue[0] is entry
        lane.queue.remove(entry)
        if was_head:
            self._after_head_change(lane)
        return entry.request

    def counter(self, tenant_id: str) -> float:
        """The tenant's virtual token counter (weighted service so far, plus lifts)."""
        lane = self._lanes.get(tenant_id)
        return 0.0 if lane is None else lane.counter

    def snapshot(self) -> FairQueueSnapshot:
        """Per-tenant counters and depths, for metrics."""
        tenants = {
            tid: TenantQueueStats(
                tid, ln.counter, len(ln.queue), ln.policy.weight, ln.policy.tier, ln.policy.sla_class
            )
            for tid, ln in self._lanes.items()
        }
        by_class: dict[str, int] = {p.sla_class: 0 for p in self._policies.values()}
        by_tier: dict[int, int] = dict.fromkeys(self._tier_order, 0)
        for stats in tenants.values():
            by_class[stats.sla_class] += stats.queued
            by_tier[stats.tier] += stats.queued
        return FairQueueSnapshot(tenants, by_class, by_tier, len(self._index))

    # -- internals -------------------------------------------------------------------------------

    def _policy(self, tenant_id: str) -> TenantPolicy:
        policy = self._policies.get(tenant_id)
        if policy is None:
            raise UnknownTenantError(tenant_id)
        return policy

    def _lane(self, tenant_id: str) -> _Lane:
        lane = self._lanes.get(tenant_id)
        if lane is None:
            lane = self._lanes[tenant_id] = _Lane(tenant_id, self._policy(tenant_id))
        return lane

    def _validate(self, request: QueuedRequest, lane: _Lane) -> None:
        if request.request_id in self._index:
            raise InvalidQueueItem(request.request_id, "already queued")
        if request.tier != lane.policy.tier:
            problem = f"tier {request.tier} != tenant tier {lane.policy.tier}"
            raise InvalidQueueItem(request.request_id, problem)
        if request.prompt_tokens < 0 or request.max_tokens < 0:
            raise InvalidQueueItem(request.request_id, "negative token count")

    def _at_risk_at(self, request: QueuedRequest) -> float:
        s = self._settings
        budget = max(0.0, request.deadline - request.arrival)
        return request.deadline - s.at_risk_margin_s - s.at_risk_margin_fraction * budget

    def _grow(self, lane: _Lane, delta: float) -> None:
        lane.counter += delta
        self._local_service[lane.tenant_id] = self._local_service.get(lane.tenant_id, 0.0) + delta

    def _lift(self, lane: _Lane) -> None:
        tier = self._tiers[lane.policy.tier]
        own = self._top(tier)
        if own is not None:
            level = own[0]
        else:
            tops = [t for t in (self._top(x) for x in self._tiers.values()) if t is not None]
            level = min(tops)[0] if tops else max(x.floor for x in self._tiers.values())
        level = max(level, tier.floor)
        tier.floor = level
        lane.counter = max(lane.counter, level)

    def _after_head_change(self, lane: _Lane) -> None:
        if lane.queue:
            self._publish(lane)
        else:
            lane.version += 1
            self._tiers[lane.policy.tier].backlogged -= 1

    def _publish(self, lane: _Lane) -> None:
        """Push fresh heap entries for a backlogged lane whose counter or head changed."""
        lane.version += 1
        tier = self._tiers[lane.policy.tier]
        head = lane.queue[0]
        heapq.heappush(tier.by_counter, (lane.counter, head.seq, lane.version, lane.tenant_id))
        if lane.policy.may_preempt:
            heapq.heappush(tier.by_risk, (head.at_risk_at, head.seq, lane.tenant_id))
        if len(tier.by_counter) > 4 * tier.backlogged + 64:
            self._compact(tier)

    def _compact(self, tier: _Tier) -> None:
        tier.by_counter = [e for e in tier.by_counter if self._counter_entry_valid(e)]
        tier.by_risk = [e for e in tier.by_risk if self._risk_entry_valid(e)]
        heapq.heapify(tier.by_counter)
        heapq.heapify(tier.by_risk)

    def _counter_entry_valid(self, entry: tuple[float, int, int, str]) -> bool:
        lane = self._lanes[entry[3]]
        return lane.version == entry[2] and bool(lane.queue)

    def _risk_entry_valid(self, entry: tuple[float, int, str]) -> bool:
        lane = self._lanes[entry[2]]
        return bool(lane.queue) and lane.queue[0].seq == entry[1]

    def _top(self, tier: _Tier) -> tuple[float, int, int, str] | None:
        heap = tier.by_counter
        while heap and not self._counter_entry_valid(heap[0]):
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _at_risk(self, tier: _Tier, now: float) -> bool:
        heap = tier.by_risk
        while heap and not self._risk_entry_valid(heap[0]):
            heapq.heappop(heap)
        return bool(heap) and heap[0][0] <= now

    def _choose(self, now: float) -> _Lane | None:
        urgent = next((t for t in self._tier_order if self._at_risk(self._tiers[t], now)), None)
        best: tuple[float, int, int, str] | None = None
        for t in self._tier_order:
            if urgent is not None and t > urgent:
                break
            top = self._top(self._tiers[t])
            if top is not None and (best is None or (top[0], t, top[1]) < (best[0], best[2], best[1])):
                best = (top[0], top[1], t, top[3])
        return None if best is None else self._lanes[best[3]]
