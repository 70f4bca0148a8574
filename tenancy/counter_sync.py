"""The pure part of sharing fair-share counters between routers: what a router sends and credits.

``SharedCounters`` (Redis) and the simulator's in-memory exchange both run this, so the simulator
measures the cluster's rule and not a copy of it.

* **Growth** (charges and refunds) is added up. A router folds the growth its queue charged
  (``FairQueue.take_local_service``) into numbered batches. A batch is published until the store
  confirms it, with the same number; the store applies a router's batch only above the last number
  it applied, so a retry never adds growth twice. The store answers with the cluster-wide totals
  per tenant; the router credits each tenant with the others' growth since its last sync:
  ``total − seen − mine``.
* **Lifts** (with ``share_lifts``; off by default, see docs/tenancy.md "Several routers": it
  halved the gap on one trace and widened it on another) travel as offsets (counter − growth,
  ``FairQueue.take_lifted``, ``tenancy/shared_lifts.py``), which the store keeps per tenant by
  maximum: publishing one twice is harmless, and two routers lifting a tenant for the same return
  raise it once. The store answers with every tenant's offset, which the router takes where it is
  higher.
"""

from __future__ import annotations

from tenancy.fair_queue import FairQueue


def merge_max(into: dict[str, float], offsets: dict[str, float]) -> None:
    for tenant, offset in offsets.items():
        into[tenant] = max(offset, into.get(tenant, offset))


class CounterBatches:
    """One router's side of the exchange: growth not yet confirmed, and the totals it last saw."""

    def __init__(self, share_lifts: bool = False) -> None:
        self.share_lifts = share_lifts
        self._seen: dict[str, float] = {}  # the store's totals as of our last sync
        self._unsent: dict[str, float] = {}  # growth charged since the batch in flight was made
        self._batch: dict[str, float] | None = None  # published until the store confirms it
        self.lifted: dict[str, float] = {}  # lift offsets published until the store confirms them
        self.number = 0

    def next_batch(self, queue: FairQueue) -> dict[str, float]:
        """The batch to publish now (with ``self.number``): the unconfirmed one, else the growth
        since. ``self.lifted`` then holds the lift offsets to publish with it."""
        for tenant, delta in queue.take_local_service().items():
            self._unsent[tenant] = self._unsent.get(tenant, 0.0) + delta
        lifted = queue.take_lifted()  # taken either way, so they do not pile up
        if self.share_lifts:
            merge_max(self.lifted, lifted)
        if self._batch is None:  # the last batch is confirmed: the growth since goes out as the next
            self._batch, self._unsent = self._unsent, {}
            self.number += 1
        return self._batch

    def confirmed(
        self, queue: FairQueue, totals: dict[str, float], offsets: dict[str, float] | None = None
    ) -> None:
        """The store applied the batch and the lifts and answered the totals and the cluster's lift
        offsets: credit the other routers' growth, take their lifts."""
        mine, self._batch, self.lifted = self._batch or {}, None, {}
        for tenant, total in totals.items():
            queue.credit(tenant, total - self._seen.get(tenant, 0.0) - mine.get(tenant, 0.0))
            self._seen[tenant] = total
        if self.share_lifts:
            queue.merge_lifts(offsets)


class CounterTotals:
    """In memory, what ``shared_counters._PUBLISH`` does in Redis: totals per tenant, each router's
    last applied batch number (a batch at or below it is not applied again), lift offsets by
    maximum."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.offsets: dict[str, float] = {}
        self._applied: dict[str, int] = {}

    def publish(
        self, router_id: str, number: int, batch: dict[str, float], lifted: dict[str, float] | None = None
    ) -> dict[str, float]:
        if number > self._applied.get(router_id, 0):
            for tenant, delta in batch.items():
                self.totals[tenant] = self.totals.get(tenant, 0.0) + delta
            self._applied[router_id] = number
        merge_max(self.offsets, lifted or {})
        return dict(self.totals)


class MemoryCounters:
    """``SharedCounters.sync`` over a ``CounterTotals`` in the same process (the simulator's routers):
    the same batches, lifts and credits, without a network that can fail."""

    def __init__(self, totals: CounterTotals, router_id: str, share_lifts: bool = False) -> None:
        self._totals, self._router_id = totals, router_id
        self._batches = CounterBatches(share_lifts)

    def sync(self, queue: FairQueue) -> None:
        b = self._batches
        batch = b.next_batch(queue)
        totals = self._totals.publish(self._router_id, b.number, batch, b.lifted)
        b.confirmed(queue, totals, dict(self._totals.offsets))
