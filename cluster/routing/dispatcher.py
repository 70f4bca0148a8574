"""Fair dispatch: requests wait in the tenancy ``FairQueue`` until a replica has room.

The router keeps at most ``capacity`` requests in flight (``replica_room`` × running replicas,
split across routers), so waiting happens here, in fair order, and not in replica queues where
arrival order would decide. ``reserved`` slots are kept for tenants that hold few slots: one
tenant may fill at most ``capacity - reserved`` of them, so a newcomer's request is dispatched at
once instead of waiting for a running request to end (that wait would be the noisy tenant's
output length, far above a quiet tenant's TTFT target).

Dispatch is event-driven: ``_kick`` pops while there is room, on every push, end and capacity
change. It is synchronous, so a pop and the hand-over of its slot happen in one event-loop step.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import dataclass, field

from cluster.errors import ServiceUnavailable
from tenancy import FairQueue, QueuedRequest


@dataclass(slots=True)
class DispatchSlot:
    """One request's place among the in-flight requests; ``release`` is idempotent."""

    request: QueuedRequest
    _owner: Dispatcher = field(repr=False)
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._owner._slot_ended(self.request.tenant_id)


class Dispatcher:
    """Grants dispatch slots in ``FairQueue`` order while this router has room."""

    def __init__(
        self,
        queue: FairQueue,
        room_per_replica: int,
        num_routers: int = 1,
        replicas: int = 1,
        queue_timeout_s: float = 60.0,
    ) -> None:
        self._queue = queue
        self._room = room_per_replica
        self._routers = num_routers
        self._replicas = replicas
        self._timeout = queue_timeout_s
        self._waiters: dict[str, asyncio.Future[None]] = {}
        self._by_tenant: Counter[str] = Counter()
        # Waiting request ids per tenant, oldest first (dicts keep insertion order); an id leaves when
        # its wait ends, however it ends, so the structure holds only what waits.
        self._waiting: dict[str, dict[str, None]] = {}
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
        return 0 if cap <= 1 else max(1, cap // 4)

    def set_replicas(self, replicas: int) -> None:
        if replicas != self._replicas:
            self._replicas = replicas
            self._kick()

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
                queue.push(moved, lift=False)
            except Exception as exc:
                future.set_exception(exc)
        self._kick()

    @property
    def waiters(self) -> int:
        """Requests waiting for a slot (a leak check: zero when nothing waits)."""
        return len(self._waiters)

    @property
    def tracked_ids(self) -> int:
        """Request ids the uncapped path can see (a leak check: only those waiting)."""
        return sum(len(ids) for ids in self._waiting.values())

    def in_flight_of(self, tenant_id: str) -> int:
        return self._by_tenant[tenant_id]

    async def wait_turn(self, request: QueuedRequest, timeout_s: float | None = None) -> DispatchSlot:
        """Queue ``request`` and wait for its slot; ``QueueFull`` at once, 503 after the timeout.

        Cancellation (client gone) removes it from the queue, or gives back a slot granted meanwhile.
        """
        self._queue.push(request)
        self._waiting.setdefault(request.tenant_id, {})[request.request_id] = None
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[request.request_id] = future
        self._kick()
        try:
            async with asyncio.timeout(self._timeout if timeout_s is None else timeout_s):
                await asyncio.shield(future)
        except TimeoutError:
            if not future.done():
                self._queue.remove(request.request_id)
                raise ServiceUnavailable("timed out waiting for a replica", code="queue_timeout") from None
        except asyncio.CancelledError:
            if _granted(future):
                self._slot_ended(request.tenant_id)
            else:
                self._queue.remove(request.request_id)
            raise
        finally:
            self._waiters.pop(request.request_id, None)
            self._forget(request)
        future.result()  # re-raises an error set by replace_queue
        return DispatchSlot(request, self)

    def _forget(self, request: QueuedRequest) -> None:
        ids = self._waiting.get(request.tenant_id)
        if ids is not None:
            ids.pop(request.request_id, None)
            if not ids:
                del self._waiting[request.tenant_id]

    def _slot_ended(self, tenant_id: str) -> None:
        self.in_flight -= 1
        self._by_tenant[tenant_id] -= 1
        self._kick()

    def _kick(self) -> None:
        while self.in_flight < self.capacity:
            head = self._queue.peek_next()
            if head is None:
                return
            popped = self._queue.pop_next() if not self._capped(head.tenant_id) else self._pop_uncapped()
            if popped is None:
                return
            future = self._waiters.get(popped.request_id)
            if future is None or future.done():
                continue  # its waiter is gone; nothing to hand the slot to
            self.in_flight += 1
            self._by_tenant[popped.tenant_id] += 1
            future.set_result(None)

    def _capped(self, tenant_id: str) -> bool:
        return self._by_tenant[tenant_id] >= self.capacity - self.reserved

    def _pop_uncapped(self) -> QueuedRequest | None:
        """The fair choice is at its cap and cannot use the free slot: give it to the uncapped tenant
        with the smallest counter instead (work-conserving; the capped tenant loses nothing it could use).

        ``FairQueue`` pops only its own choice, so this removes the request by id and charges its
        prompt the way ``pop_next`` would (prompt / weight, expressed as output tokens at ×2).
        """
        best: tuple[float, str] | None = None
        for tenant_id, ids in self._waiting.items():
            if not self._capped(tenant_id) and any(rid in self._queue for rid in ids):
                key = (self._queue.counter(tenant_id), tenant_id)
                best = key if best is None or key < best else best
        if best is None:
            return None
        oldest = next(rid for rid in self._waiting[best[1]] if rid in self._queue)
        request = self._queue.remove(oldest)
        if request is not None:
            self._queue.charge(request.tenant_id, math.ceil(request.prompt_tokens / 2))
        return request


def _granted(future: asyncio.Future[None]) -> bool:
    """A slot was handed over (result set), as opposed to pending, cancelled or failed."""
    return future.done() and not future.cancelled() and future.exception() is None
