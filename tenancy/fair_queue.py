"""Weighted fair queue across tenants: virtual token counters (VTC) plus SLA-tier deadlines.

Rule (docs/tenancy.md proves the fairness bound):

* Each tenant has a counter ``c = service / weight``. A dispatch charges the request's reservation
  (``prompt × 1 + max_tokens × 2``); its end settles it (``settle``: unproduced output refunded,
  cached prompt tokens at ``cached_prompt_token_cost``). See ``tenancy/fair_charges.py``.
* A tenant that becomes backlogged (its queue was empty) is lifted: ``c = max(c, L)`` with ``L``
  the smallest counter among backlogged tenants of its tier, or, when its tier has none, the
  larger of the tier's floor and the smallest counter among all backlogged tenants. Idle time
  banks no credit. Several routers may share lifts as offsets (``tenancy/shared_lifts.py``).
* A request is *at risk* when ``now >= deadline - (margin_s + margin_fraction × TTFT target)``.
  Let ``k*`` be the most urgent tier (smallest number) whose class may preempt lower tiers and
  that has an at-risk head-of-line request of an eligible tenant. Candidates are the eligible
  backlogged tenants of tiers ``<= k*``; without such a tier, all eligible backlogged tenants.
* The next request is the oldest one of the candidate tenant with the smallest counter (ties:
  more urgent tier, then older head). If it does not fit ``capacity``, nothing is popped.

``order`` (``tenancy/dispatch_policy.py``) picks one of three orderings on this one code path:
``fairlane`` as above, ``vtc`` with all tenants in one tier, ``fcfs`` by oldest head instead of
counter. Every dispatch thus goes to the smallest counter of its own tier among eligible tenants,
which is all the VTC bound needs.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping

from tenancy.config import FairShareSettings, TenancyConfig
from tenancy.dispatch_policy import (
    DEFAULT_DISPATCH_POLICY,
    DispatchPolicy,
    check_dispatch_policy,
    orders_by_arrival,
    policies_for,
)
from tenancy.errors import InvalidQueueItem, QueueFull, UnknownTenantError
from tenancy.fair_charges import OUTPUT_TOKEN_COST, reservation, settlement
from tenancy.fair_lanes import Eligible, Entry, Lane, Tier, TierHeaps
from tenancy.fair_selection import choose, lift_level
from tenancy.fair_sharing import QueueSharing
from tenancy.lane_lengths import LaneLengths
from tenancy.queue_snapshot import FairQueueSnapshot, TenantQueueStats
from tenancy.queued_request import QueuedRequest, TenantPolicy, policies_from_config
from tenancy.shared_lifts import SharedLifts


class FairQueue(QueueSharing):
    """Waiting requests of all tenants, popped in weighted-fair, SLA-aware order. Not thread-safe."""

    def __init__(
        self,
        policies: Mapping[str, TenantPolicy],
        settings: FairShareSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        order: DispatchPolicy = DEFAULT_DISPATCH_POLICY,
    ) -> None:
        self.order = check_dispatch_policy(order)
        self._by_arrival = orders_by_arrival(self.order)
        self._policies = policies_for(self.order, policies)
        self._settings = settings or FairShareSettings()
        self._clock = clock
        self._lanes: dict[str, Lane] = {}
        self._heaps = TierHeaps(self._lanes)
        self._tiers: dict[int, Tier] = {p.tier: Tier(p.tier) for p in self._policies.values()}
        self._tier_order = sorted(self._tiers)
        self._tier_list = [self._tiers[t] for t in self._tier_order]
        self._index: dict[str, Entry] = {}
        self._lengths = LaneLengths()
        self._seq = itertools.count()
        self._local_service: dict[str, float] = {}  # counter growth charged here, not yet shared
        self._lifts = SharedLifts()  # lift offsets raised here, not yet shared
        self._backlogged_weight = 0.0  # the weights of the tenants with requests waiting

    @classmethod
    def from_config(
        cls,
        config: TenancyConfig,
        clock: Callable[[], float] = time.monotonic,
        order: DispatchPolicy = DEFAULT_DISPATCH_POLICY,
    ) -> FairQueue:
        return cls(policies_from_config(config), config.fair_share, clock, order)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._index

    def now(self) -> float:
        """The queue's clock (the dispatcher reads it once per round of pops)."""
        return self._clock()

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

    def push(self, request: QueuedRequest, lift: bool = True) -> QueuedRequest | None:
        """Enqueue; raises ``QueueFull`` when a bound is reached, ``InvalidQueueItem`` for bad items.

        At the total bound, a request whose tenant has fewer waiting than the longest lane pushes
        out that lane's newest request, which is returned (its caller gets ``QueueFull``); the
        longest lane's own tenant is refused instead. ``lift=False``: the tenant was backlogged
        already (a request carried over by ``carry_from``), so its counter stays as it was instead
        of being lifted as if it returned from idle.
        """
        lane = self._lane(request.tenant_id)
        self._validate(request, lane)
        if len(lane.queue) >= self._settings.max_queue_per_tenant:
            raise QueueFull(request.tenant_id, "tenant", self._settings.max_queue_per_tenant)
        evicted = None
        if len(self._index) >= self._settings.max_queue_total:
            evicted = self._push_out(len(lane.queue))
            if evicted is None:
                raise QueueFull(request.tenant_id, "total", self._settings.max_queue_total)
        entry = Entry(next(self._seq), request, self._at_risk_at(request), fresh=lift and not lane.queue)
        self._index[request.request_id] = entry
        lane.queue.append(entry)
        self._lengths.changed(lane.tenant_id, len(lane.queue) - 1, len(lane.queue))
        if len(lane.queue) == 1:
            if lift:
                self._lift(lane)
            self._tiers[lane.policy.tier].backlogged += 1
            self._backlogged_weight += lane.policy.weight
            self._publish(lane)
        return evicted

    def _push_out(self, arriving_length: int) -> QueuedRequest | None:
        longest = self._lengths.longest()
        if longest is None or longest[1] <= arriving_length + 1:
            return None
        return self.remove(self._lanes[longest[0]].queue[-1].request.request_id)

    def peek_next(self, now: float | None = None, eligible: Eligible | None = None) -> QueuedRequest | None:
        """The request ``pop_next`` would return given enough capacity, without removing it."""
        lane = self._choose(self._clock() if now is None else now, eligible)
        return None if lane is None else lane.queue[0].request

    def pop_next(
        self, capacity: int | None = None, now: float | None = None, eligible: Eligible | None = None
    ) -> QueuedRequest | None:
        """Remove and return the next request, or None when empty or when it exceeds ``capacity``.

        ``capacity`` is the tokens (prompt + max output) the chosen replica can take; None means
        unbounded. A None return with a non-empty queue means the fair choice does not fit: other
        tenants are not served past it (that would break the fairness bound). ``eligible(tenant)``
        False skips that tenant's requests (the dispatcher's per-tenant cap): the choice is made
        among the others, and charged and floored exactly as any pop.
        """
        lane = self._choose(self._clock() if now is None else now, eligible)
        if lane is None:
            return None
        head = lane.queue[0]
        if capacity is not None and head.request.size > capacity:
            return None
        lane.queue.popleft()
        self._lengths.changed(lane.tenant_id, len(lane.queue) + 1, len(lane.queue))
        del self._index[head.request.request_id]
        tier = self._tiers[lane.policy.tier]
        tier.floor = max(tier.floor, lane.counter)
        self._grow(lane, reservation(head.request) / lane.policy.weight)
        self._after_head_change(lane)
        return head.request

    def settle(self, request: QueuedRequest, output_tokens: int, cached_tokens: int = 0) -> None:
        """Settle a popped request at its end (once): refund its unproduced output and the discount
        on prompt tokens served from the prefix cache. A tenant a reload removed is not settled."""
        delta = settlement(request, output_tokens, cached_tokens, self._settings.cached_prompt_token_cost)
        if request.tenant_id in self._policies and delta:
            lane = self._lane(request.tenant_id)
            self._grow(lane, delta / lane.policy.weight)
            if lane.queue:
                self._publish(lane)

    def charge(self, tenant_id: str, output_tokens: int) -> None:
        """Charge output tokens beyond any reservation (weighted, ×2); a tenant that a reload
        removed is not charged (its requests in flight finish; nothing waits behind its counter)."""
        if output_tokens < 0:
            raise ValueError("output_tokens must be >= 0")
        if tenant_id not in self._policies:
            return
        lane = self._lane(tenant_id)
        self._grow(lane, OUTPUT_TOKEN_COST * output_tokens / lane.policy.weight)
        if lane.queue:
            self._publish(lane)

    def waiting(self) -> list[QueuedRequest]:
        """The waiting requests, oldest first."""
        return [entry.request for entry in self._index.values()]

    def remove(self, request_id: str) -> QueuedRequest | None:
        """Drop a waiting request (client gone); None if it is not waiting (already popped or unknown)."""
        entry = self._index.pop(request_id, None)
        if entry is None:
            return None
        lane = self._lanes[entry.request.tenant_id]
        was_head = lane.queue[0] is entry
        lane.queue.remove(entry)
        self._lengths.changed(lane.tenant_id, len(lane.queue) + 1, len(lane.queue))
        if was_head:
            self._after_head_change(lane)
        return entry.request

    def waiting_share(self, tenant_id: str) -> tuple[int, float]:
        """The tenant's requests waiting, and the share of the dispatches its weight earns among the
        tenants with requests waiting, itself counted among them (the admission's wait estimate)."""
        lane = self._lanes.get(tenant_id)
        weight = self._policy(tenant_id).weight
        waiting = 0 if lane is None else len(lane.queue)
        others = self._backlogged_weight - (weight if waiting else 0.0)
        return waiting, weight / (weight + max(0.0, others))

    def counter(self, tenant_id: str) -> float:
        """The tenant's virtual token counter (weighted service so far, plus lifts)."""
        lane = self._lanes.get(tenant_id)
        return 0.0 if lane is None else lane.counter

    def snapshot(self) -> FairQueueSnapshot:
        """Per-tenant counters and depths, for metrics."""
        stats = [
            TenantQueueStats(
                t, ln.counter, len(ln.queue), ln.policy.weight, ln.policy.tier, ln.policy.sla_class
            )
            for t, ln in self._lanes.items()
        ]
        classes = {p.sla_class for p in self._policies.values()}
        return FairQueueSnapshot.of(stats, classes, self._tier_order, len(self._index))

    # -- internals -------------------------------------------------------------------------------

    def policy(self, tenant_id: str) -> TenantPolicy | None:
        """The tenant's policy under this queue's order (its tier, weight, class), or None."""
        return self._policies.get(tenant_id)

    def _policy(self, tenant_id: str) -> TenantPolicy:
        policy = self._policies.get(tenant_id)
        if policy is None:
            raise UnknownTenantError(tenant_id)
        return policy

    def _lane(self, tenant_id: str) -> Lane:
        lane = self._lanes.get(tenant_id)
        if lane is None:
            lane = self._lanes[tenant_id] = Lane(tenant_id, self._policy(tenant_id))
        return lane

    def _validate(self, request: QueuedRequest, lane: Lane) -> None:
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

    def _lift(self, lane: Lane) -> None:
        if self._by_arrival:
            return  # counters do not order fcfs; they only report service
        self._lifts.lift(lane, lift_level(self._heaps, self._tiers[lane.policy.tier], self._tier_list))

    def _after_head_change(self, lane: Lane) -> None:
        if lane.queue:
            self._publish(lane)
        else:
            lane.version += 1
            self._tiers[lane.policy.tier].backlogged -= 1
            self._backlogged_weight = self._backlogged_weight - lane.policy.weight if self._index else 0.0

    def _publish(self, lane: Lane) -> None:
        key = float(lane.queue[0].seq) if self._by_arrival else lane.counter
        self._heaps.publish(self._tiers[lane.policy.tier], lane, key)

    def _choose(self, now: float, eligible: Eligible | None) -> Lane | None:
        tenant_id = choose(self._heaps, self._tier_list, now, eligible)
        return None if tenant_id is None else self._lanes[tenant_id]
