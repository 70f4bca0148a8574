"""Fair dispatch: requests wait in the tenancy ``FairQueue`` until a replica has room.

The router keeps at most ``capacity`` requests in flight (``replica_room`` × running replicas,
split across routers), so waiting happens here, in fair order, and not in replica queues where
arrival order would decide. ``reserved`` slots are kept for tenants that hold few slots: one
tenant may fill at most ``capacity - reserved`` of them, so a newcomer's request is dispatched at
once instead of waiting for a running request to end (that wait would be the noisy tenant's
output length, far above a quiet tenant's TTFT target).

**Displacing dispatch.** A full room would make an interactive request wait for a batch request to
end, however urgent its class. So past the room, up to ``reserved`` more requests go out, each for
a tenant whose class may preempt lower tiers, and only while more lower-tier requests are in flight
than requests already sent past the room: the replica's scheduler preempts its lowest tier's latest
arrival to start the newcomer's prefill (``replica/scheduler.py``), and that request is recomputed
later. Under ``vtc`` every tenant shares one tier and under ``fcfs`` nothing is reserved, so
neither displaces. Such a pop is charged and floored as any pop (an eligibility filter, like the cap).

Dispatch is event-driven: ``_kick`` pops while there is room, on every push, end and capacity
change. It is synchronous, so a pop and the hand-over of its slot happen in one event-loop step.
A tenant at its cap is skipped by the queue itself (``pop_next(eligible=...)``), which charges the
request it picks instead as any pop. Under ``fcfs`` (arrival order) no room is reserved.

A slot's ``release(output_tokens, cached_tokens)`` settles the request in the queue: the pop charged
its reservation (prompt + 2 × max_tokens), the end refunds what it did not use.

A replica that Serve stops (scale-down, rolling update) leaves the running set while its requests
finish: the room is then that of the replicas that stay, so those requests stop counting against
it (``set_live``; each slot learns its replica from the first output, ``placed_on``). Otherwise a
drain of long streams would hold the survivors' room and new requests would time out waiting.

**Admission by expected wait.** A request that would wait past the queue's time bound is refused
at once with a 429 and a Retry-After (``QueueWaitTooLong``), not accepted and answered with a 503
when the bound runs out: the client learns in milliseconds what it would have learned in a minute,
and retries when the backlog has drained. The wait is estimated from the rate slots free up while
the router is busy (``DrainRate``) and the tenant's own lane at its weight's share of the
dispatches, so one tenant's backlog refuses that tenant, not a quiet one. A cold router (no
estimate yet) admits.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import dataclass, field

from cluster.errors import ServiceUnavailable
from cluster.routing.drain_rate import DrainRate
from tenancy import FairQueue, QueuedRequest, QueueFull, QueueWaitTooLong


@dataclass(slots=True)
class DispatchSlot:
    """One request's place among the in-flight requests; ``release`` is idempotent."""

    request: QueuedRequest
    _owner: Dispatcher = field(repr=False)
    released: bool = False
    replica_id: str = ""
    detached: bool = False  # its replica is stopping: it no longer takes room of the running ones

    def placed_on(self, replica_id: str | None) -> None:
        """The replica the request runs on (its outputs say so); cheap when unchanged."""
        if replica_id and replica_id != self.replica_id and not self.released:
            self._owner._slot_placed(self, replica_id)

    def release(self, output_tokens: int = 0, cached_tokens: int = 0) -> None:
        """End the request's turn: free the slot and settle its charge with what it produced and
        how many prompt tokens the replica's prefix cache served."""
        if not self.released:
            self.released = True
            self._owner._placed.pop(self.request.request_id, None)
            self._owner._slot_ended(self.request, output_tokens, cached_tokens, holds_room=not self.detached)


class Dispatcher:
    """Grants dispatch slots in ``FairQueue`` order while this router has room."""

    def __init__(
        self,
        queue: FairQueue,
        room_per_replica: int,
        num_routers: int = 1,
        replicas: int = 1,
        queue_timeout_s: float = 60.0,
        displace: bool = True,
    ) -> None:
        self._queue = queue
        self._displace = displace  # the simulator's replicas preempt no tier: it passes False
        self._room = room_per_replica
        self._routers = num_routers
        self._replicas = replicas
        self._timeout = queue_timeout_s
        self._waiters: dict[str, asyncio.Future[None]] = {}
        self._by_tenant: Counter[str] = Counter()
        self._by_tier: Counter[int] = Counter()  # requests holding room, by their tier
        self._live: frozenset[str] | None = None  # replica ids Serve routes to; None: not known
        self._placed: dict[str, DispatchSlot] = {}  # request id -> its slot, once its replica is known
        self._drain = DrainRate()
        self.in_flight = 0

    @property
    def queue(self) -> FairQueue:
        return self._queue

    @property
    def capacity(self) -> int:
        """Requests this router may have in flight: its share of every replica's room."""
        if self._replicas <= 0:
            return 0
        return max(1, math.ceil(self._room * self._replicas / self._routers))

    @property
    def reserved(self) -> int:
        """Slots one tenant cannot take: a quarter of the room, at least one when the room allows."""
        cap = self.capacity
        if cap <= 1 or self._queue.order == "fcfs":
            return 0
        return max(1, cap // 4)

    @property
    def displacing(self) -> int:
        """Requests in flight past the room (each displaces lower-tier work on its replica)."""
        return max(0, self.in_flight - self.capacity)

    @property
    def room(self) -> int:
        """Requests in flight per replica (over every router) at most."""
        return self._room

    def set_room(self, room: int) -> None:
        """The room per replica now (the slots the replicas report, when no room is set)."""
        room = max(1, room)
        if room != self._room:
            self._room = room
            self._kick()

    def set_replicas(self, replicas: int) -> None:
        if replicas != self._replicas:
            self._replicas = replicas
            self._kick()

    def set_routers(self, routers: int) -> None:
        """Routers sharing the replicas' room now (routers that autoscale, or one restarting)."""
        routers = max(1, routers)
        if routers != self._routers:
            self._routers = routers
            self._kick()  # a larger share may free slots at once

    def set_live(self, replica_ids: frozenset[str]) -> None:
        """The replicas Serve routes to now: slots on any other replica stop taking room."""
        if replica_ids == self._live:
            return
        self._live = replica_ids
        changed = [self._hold_room_if_live(slot) for slot in list(self._placed.values())]
        if any(changed):
            self._kick()

    def _slot_placed(self, slot: DispatchSlot, replica_id: str) -> None:
        slot.replica_id = replica_id
        self._placed[slot.request.request_id] = slot
        if self._hold_room_if_live(slot):  # the usual first output changes nothing: no pop round
            self._kick()

    def _hold_room_if_live(self, slot: DispatchSlot) -> bool:
        """A slot holds room while its replica runs (or before the running set is known). A retry
        that moves a request from a stopping replica to a running one takes room again. True: the
        slot's hold changed."""
        holds = self._live is None or slot.replica_id in self._live
        if holds == (not slot.detached):
            return False
        slot.detached = not holds
        step = 1 if holds else -1
        self.in_flight += step
        self._by_tenant[slot.request.tenant_id] += step
        self._by_tier[slot.request.tier] += step
        return True

    def replace_queue(self, queue: FairQueue) -> None:
        """Move to ``queue`` (a reloaded config): fair-share counters carry over for the tenants that
        still exist, and the waiting requests move, oldest first, without the lift of a tenant that
        returns from idle (they were backlogged already). A request whose tenant no longer exists, or
        that a smaller bound leaves out, fails with that error instead of waiting forever.
        """
        old, self._queue = self._queue, queue
        queue.carry_from(old)
        for item in old.waiting():
            future = self._waiters.get(item.request_id)
            if future is None or future.done():
                continue
            try:
                moved = queue.make_request(
                    item.request_id, item.tenant_id, item.prompt_tokens, item.max_tokens, item.arrival
                )
                self._refuse(queue.push(moved, lift=False))
            except Exception as exc:
                future.set_exception(exc)
        self._kick()

    @property
    def waiters(self) -> int:
        """Requests waiting for a slot (a leak check: zero when nothing waits)."""
        return len(self._waiters)

    def in_flight_of(self, tenant_id: str) -> int:
        return self._by_tenant[tenant_id]

    async def wait_turn(self, request: QueuedRequest, timeout_s: float | None = None) -> DispatchSlot:
        """Queue ``request`` and wait for its slot; ``QueueFull`` at once (a bound, or a wait expected
        past the timeout), 503 after the timeout.

        Cancellation (client gone) removes it from the queue, or gives back a slot granted meanwhile.
        """
        timeout_s = self._timeout if timeout_s is None else timeout_s
        self._admit_by_wait(request.tenant_id, timeout_s)
        self._refuse(self._queue.push(request))
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[request.request_id] = future
        self._kick()
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(future)
        except TimeoutError:
            if not future.done():
                self._queue.remove(request.request_id)
                raise ServiceUnavailable("timed out waiting for a replica", code="queue_timeout") from None
        except asyncio.CancelledError:
            if _granted(future):
                self._slot_ended(request)
            else:
                self._queue.remove(request.request_id)
            raise
        finally:
            self._waiters.pop(request.request_id, None)
        future.result()  # re-raises an error set by replace_queue
        return DispatchSlot(request, self)

    def expected_wait_s(self, tenant_id: str) -> float | None:
        """Seconds a request of ``tenant_id`` queued now would wait for its slot (0 when nothing
        waits); None before the router has been busy long enough to tell its pace."""
        if not len(self._queue):
            return 0.0
        waiting, share = self._queue.waiting_share(tenant_id)
        return self._drain.expected_wait_s(waiting, share)

    def _admit_by_wait(self, tenant_id: str, timeout_s: float) -> None:
        wait = self.expected_wait_s(tenant_id)
        if wait is not None and wait > timeout_s:
            raise QueueWaitTooLong(tenant_id, wait, timeout_s)

    def _refuse(self, evicted: QueuedRequest | None) -> None:
        """A request pushed out of a full queue by a tenant with fewer waiting: it gets the 429."""
        if evicted is None:
            return
        future = self._waiters.get(evicted.request_id)
        if future is not None and not future.done():
            future.set_exception(QueueFull(evicted.tenant_id, "total", len(self._queue)))

    def _slot_ended(
        self, request: QueuedRequest, output_tokens: int = 0, cached_tokens: int = 0, holds_room: bool = True
    ) -> None:
        if holds_room:
            if self._busy:
                self._drain.slot_ended(self._queue.now())
            self.in_flight -= 1
            self._by_tenant[request.tenant_id] -= 1
            self._by_tier[request.tier] -= 1
        self._queue.settle(request, output_tokens, cached_tokens)
        self._kick()
        if not self._busy:
            self._drain.became_idle()

    @property
    def _busy(self) -> bool:
        """Every slot is taken, or a request waits for one: ends then come at the replicas' pace."""
        return self.in_flight >= self.capacity or len(self._queue) > 0

    def _kick(self) -> None:
        now = self._queue.now()  # one clock read per round of pops
        while True:
            if self.in_flight < self.capacity:
                eligible = self._below_cap
            elif self._displace and self.in_flight < self.capacity + self.reserved and len(self._queue):
                eligible = self._displaces
            else:
                return
            popped = self._queue.pop_next(now=now, eligible=eligible)
            if popped is None:
                return
            future = self._waiters.get(popped.request_id)
            if future is None or future.done():
                self._queue.settle(popped, 0)  # its waiter is gone; nothing ran
                continue
            self.in_flight += 1
            self._by_tenant[popped.tenant_id] += 1
            self._by_tier[popped.tier] += 1
            if self.in_flight >= self.capacity:
                self._drain.became_busy(now)
            future.set_result(None)

    def _below_cap(self, tenant_id: str) -> bool:
        """A tenant may take a free slot while it holds fewer than ``capacity - reserved``."""
        return self._by_tenant[tenant_id] < self.capacity - self.reserved

    def _displaces(self, tenant_id: str) -> bool:
        """Past a full room: a tenant below its cap whose class may preempt lower tiers, while more
        lower-tier requests are in flight than requests already sent past the room."""
        policy = self._queue.policy(tenant_id)
        if policy is None or not policy.may_preempt or not self._below_cap(tenant_id):
            return False
        lower = sum(n for tier, n in self._by_tier.items() if tier > policy.tier)
        return lower > self.displacing


def _granted(future: asyncio.Future[None]) -> bool:
    """A slot was handed over (result set), as opposed to pending, cancelled or failed."""
    return future.done() and not future.cancelled() and future.exception() is None
