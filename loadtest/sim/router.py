"""The simulated router: the real admission, fair queue and dispatcher, driven by simulated time.

* Admission: ``tenancy.QuotaManager.admit_sync`` / ``release_sync`` over a ``MemoryQuotaStore``,
  both with the event loop's clock.
* Waiting: the real ``FairQueue`` under the policy's dispatch order (fcfs, vtc or fairlane).
* Dispatch: the real ``cluster.routing.dispatcher.Dispatcher``. Its public entry point ``wait_turn`` is
  a coroutine (asyncio futures and timeouts), so the simulator does what ``wait_turn`` does
  without the event loop: push, register a waiter, ``_kick()``; the waiter is a ``_Grant`` whose
  ``set_result`` hands the request to a replica (NEEDS.md item 1 asks for a sync entry point).
  Slots are released through the real ``DispatchSlot.release``.
* Charges as in the cluster: the pop charges the request's reservation (prompt + 2 × max_tokens),
  the end settles it through ``DispatchSlot.release(output, cached)``.
* Several routers (``ClusterSpec.routers``): each is one ``SimRouter`` with its own queue, its own
  dispatcher holding its share of the room and its own replica choice; ``multi_router.py`` says
  which router a request reaches and how their counters are exchanged.
"""

from __future__ import annotations

from cluster.routing.dispatcher import Dispatcher, DispatchSlot
from loadtest.sim.events import EventLoop
from loadtest.sim.outcomes import LIMIT, QUEUE_FULL, QUEUE_TIMEOUT, QUOTA, BacklogSampler, Outcomes
from loadtest.sim.pool import ReplicaPool
from loadtest.sim.replica import Job, SimReplica
from loadtest.sim.replica_choice import Chooser
from loadtest.sim.workload import Trace
from tenancy import (
    FairQueue,
    Lease,
    QueuedRequest,
    QueueFull,
    QuotaExceeded,
    QuotaManager,
    RequestLimitExceeded,
)


class _Grant:
    """Stands in for the asyncio future ``Dispatcher._kick`` resolves when it grants a slot."""

    __slots__ = ("_done", "_rid", "_router")

    def __init__(self, router: SimRouter, rid: str) -> None:
        self._router, self._rid, self._done = router, rid, False

    def done(self) -> bool:
        return self._done

    def set_result(self, _: object) -> None:
        self._done = True
        self._router._granted(self._rid)


class SimRouter:
    def __init__(
        self,
        loop: EventLoop,
        trace: Trace,
        quotas: QuotaManager | None,
        dispatcher: Dispatcher,
        chooser: Chooser,
        pool: ReplicaPool,
        outcomes: Outcomes,
        sampler: BacklogSampler,
        max_ongoing: int,
        queue_timeout_s: float,
        dispatch_latency_s: float = 0.0,
        client_latency_s: float = 0.0,
    ) -> None:
        self._loop, self._trace, self._quotas = loop, trace, quotas
        self._dispatcher, self._queue = dispatcher, dispatcher.queue
        self._chooser, self._pool, self._outcomes, self._sampler = chooser, pool, outcomes, sampler
        self._max_ongoing, self._timeout = max_ongoing, queue_timeout_s
        # Measured fixed latencies (loadtest/sim/overheads.py): the Serve hop to the replica delays
        # the engine's admission; the client sees first token and end later than the router does.
        self._dispatch_s, self._client_s = dispatch_latency_s, client_latency_s
        self._tenant_ids = [t.id for t in trace.tenants]
        self._leases: dict[int, Lease] = {}
        self._queued: dict[str, QueuedRequest] = {}
        self._slots: dict[int, DispatchSlot] = {}
        self.in_system = 0
        self.waiting = [0] * len(trace.tenants)  # per tenant index: requests in this router's queue

    def arrive(self, i: int) -> None:
        """Request ``i`` of the trace reaches the router (already authenticated)."""
        now, t = self._loop.now, self._trace
        tenant = self._tenant_ids[t.tenant[i]]
        prompt, max_tokens = int(t.prompt[i]), int(t.max_tokens[i])
        if self._quotas is not None:
            try:
                self._leases[i] = self._quotas.admit_sync(tenant, prompt, max_tokens)
            except QuotaExceeded as exc:
                self._outcomes.fail(i, QUOTA, now, exc.reason)
                return
            except RequestLimitExceeded as exc:
                self._outcomes.fail(i, LIMIT, now, exc.limit)
                return
        rid = str(i)
        request = self._queue.make_request(rid, tenant, prompt, max_tokens)
        try:
            evicted = self._queue.push(request)
        except QueueFull as exc:
            self._end_lease(i, 0)
            self._outcomes.fail(i, QUEUE_FULL, now, exc.scope)
            return
        if evicted is not None:  # pushed out of the full queue by a shorter lane: a 429 for it
            self._drop(evicted.request_id, QUEUE_FULL, "total")
        self.in_system += 1
        self.waiting[t.tenant[i]] += 1
        self._sampler.enqueued(t.tenant[i])
        self._queued[rid] = request
        d = self._dispatcher
        d._waiters[rid] = _Grant(self, rid)
        d._kick()
        if rid in d._waiters:
            self._loop.after(self._timeout, self._expire, rid)

    @property
    def queue(self) -> FairQueue:
        return self._queue

    def kick(self) -> None:
        """Capacity changed (replicas ready or gone): let the dispatcher fill the room."""
        self._dispatcher._kick()

    def replicas_changed(self, ready: list[SimReplica], n: int) -> None:
        """Replicas became ready or left: the choice sees them, the room is this router's share."""
        self._chooser.refresh(ready)
        self._dispatcher.set_replicas(n)

    def refresh_stats(self, ready: list[SimReplica]) -> None:
        """The replicas' routing stats were polled (every ``routing_stats_period_s``)."""
        self._chooser.refresh(ready)

    def _granted(self, rid: str) -> None:
        d, i = self._dispatcher, int(rid)
        del d._waiters[rid]
        request = self._queued.pop(rid)
        tenant = self._trace.tenant[i]
        self.waiting[tenant] -= 1
        self._sampler.dequeued(tenant)
        self._slots[i] = DispatchSlot(request, d)
        self._outcomes.dispatched[i] = self._loop.now
        replica = self._chooser.choose(self._pool.ready, self._max_ongoing)
        if replica is None:  # every replica at max_ongoing: Serve would queue at the handle
            replica = min(self._pool.ready + self._pool.draining, key=lambda r: r.ongoing)
        job = Job(i, request.prompt_tokens, max(1, request.max_tokens))
        if self._dispatch_s > 0:
            self._loop.after(self._dispatch_s, replica.submit, job)
        else:
            replica.submit(job)
        self._chooser.changed(replica)

    def finished(self, job: Job, now: float) -> None:
        i = job.rid
        c = self._client_s
        self._outcomes.done(i, job.first_token + c, now + c, job.output, job.replica)
        self._chooser.changed(self._pool.by_index(job.replica))
        self._end_lease(i, job.output)
        self.in_system -= 1
        self._slots.pop(i).release(job.output)

    def _expire(self, rid: str) -> None:
        if rid in self._dispatcher._waiters:
            self._queue.remove(rid)
            self._drop(rid, QUEUE_TIMEOUT)

    def _drop(self, rid: str, status: int, reason: str = "") -> None:
        """A waiting request that leaves the queue unserved (timed out, or pushed out)."""
        i = int(rid)
        del self._dispatcher._waiters[rid]
        self._queued.pop(rid)
        self.waiting[self._trace.tenant[i]] -= 1
        self._sampler.dequeued(self._trace.tenant[i])
        self._end_lease(i, 0)
        self.in_system -= 1
        self._outcomes.fail(i, status, self._loop.now, reason)

    def _end_lease(self, i: int, output: int) -> None:
        lease = self._leases.pop(i, None)
        if lease is not None and self._quotas is not None:
            self._quotas.release_sync(lease, output)
