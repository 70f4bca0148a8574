"""What a router's fair queue hands on: counter changes to the other routers' queues, and its
state to the queue that replaces it when the tenancy config is reloaded.

Several routers each keep a queue; what one charges (``take_local_service``) and the lift offsets
it raises (``take_lifted``) are shared through ``tenancy/counter_sync.py``, and come back to the
others as ``credit`` and ``merge_lifts`` (docs/tenancy.md, "Several routers"). ``carry_from`` moves
counters, floors and unshared changes to a reloaded queue.
"""

from __future__ import annotations

from collections.abc import Mapping

from tenancy.fair_lanes import Lane, Tier
from tenancy.queued_request import TenantPolicy
from tenancy.shared_lifts import SharedLifts


class QueueSharing:
    """``FairQueue``'s sharing side (a base class): it works on the queue's lanes and tiers."""

    _policies: Mapping[str, TenantPolicy]
    _lanes: dict[str, Lane]
    _tiers: dict[int, Tier]
    _local_service: dict[str, float]  # counter growth charged here, not yet shared
    _lifts: SharedLifts  # lift offsets raised here, not yet shared

    # The queue's own (``FairQueue``): a tenant's lane, made on first use, and a backlogged lane's
    # new heap entries after its counter or head changed.
    def _lane(self, tenant_id: str) -> Lane:
        raise NotImplementedError

    def _publish(self, lane: Lane) -> None:
        raise NotImplementedError

    def credit(self, tenant_id: str, counter_delta: float) -> None:
        """Add counter change that another router charged or refunded (already divided by the weight)."""
        if not counter_delta or tenant_id not in self._policies:
            return
        lane = self._lane(tenant_id)
        lane.counter += counter_delta
        if lane.queue:
            self._publish(lane)

    def carry_from(self, old: QueueSharing) -> None:
        """Take over ``old``'s counters and unshared service (tenants that still exist) and tier floors
        (tiers that still exist): a reloaded config neither forgives service nor forgets it."""
        for tenant_id, lane in old._lanes.items():
            if tenant_id in self._policies:
                new = self._lane(tenant_id)
                new.counter, new.offset = lane.counter, lane.offset
        for number, tier in old._tiers.items():
            if number in self._tiers:
                self._tiers[number].floor = max(self._tiers[number].floor, tier.floor)
        self._local_service = {t: s for t, s in old._local_service.items() if t in self._policies}
        self._lifts = old._lifts

    def take_local_service(self) -> dict[str, float]:
        """Counter change charged by this queue since the last call, per tenant (to share it)."""
        taken, self._local_service = self._local_service, {}
        return taken

    def take_lifted(self) -> dict[str, float]:
        """Lift offsets (counter − growth) raised here since the last call, per tenant (to share)."""
        return self._lifts.take()

    def merge_lifts(self, offsets: Mapping[str, float]) -> None:
        """Take the cluster's lift offsets (``tenancy/shared_lifts.py``): each counter rises by how
        much its tenant's offset exceeds the one known here."""
        for tenant_id, offset in offsets.items():
            if tenant_id in self._policies:
                lane = self._lane(tenant_id)
                if self._lifts.merge(lane, offset) and lane.queue:
                    self._publish(lane)

    def _grow(self, lane: Lane, delta: float) -> None:
        lane.counter += delta
        self._local_service[lane.tenant_id] = self._local_service.get(lane.tenant_id, 0.0) + delta
