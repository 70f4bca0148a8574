"""The dispatcher alone (no Ray): fair order, room, per-tenant cap, timeouts and cancellation."""

from __future__ import annotations

import asyncio

import pytest

from cluster.errors import ServiceUnavailable
from cluster.routing.dispatcher import Dispatcher
from tenancy import FairQueue, default_tenancy_config


def make(room: int = 2, replicas: int = 1, timeout: float = 5.0) -> Dispatcher:
    queue = FairQueue.from_config(default_tenancy_config())
    return Dispatcher(queue, room, replicas=replicas, queue_timeout_s=timeout)


def item(d: Dispatcher, rid: str, tenant: str, prompt: int = 10):
    return d.queue.make_request(rid, tenant, prompt, 8)


async def test_room_bounds_in_flight_and_release_dispatches_the_next() -> None:
    d = make(room=2)
    first = await d.wait_turn(item(d, "a1", "alice"))
    waiter = asyncio.create_task(d.wait_turn(item(d, "b1", "bob")))
    third = asyncio.create_task(d.wait_turn(item(d, "c1", "carol")))
    await asyncio.sleep(0.01)
    assert d.in_flight == 2 and waiter.done() and not third.done()
    first.release()
    first.release()  # idempotent
    slot = await asyncio.wait_for(third, 1)
    assert d.in_flight == 2 and slot.request.request_id == "c1"


async def test_one_tenant_cannot_take_the_reserved_slot_but_another_can() -> None:
    d = make(room=4)  # capacity 4, one slot reserved
    slots = [await d.wait_turn(item(d, f"c{i}", "carol")) for i in range(3)]
    blocked = asyncio.create_task(d.wait_turn(item(d, "c3", "carol")))
    await asyncio.sleep(0.01)
    assert not blocked.done() and d.in_flight == 3
    quiet = await asyncio.wait_for(d.wait_turn(item(d, "a0", "alice")), 1)
    assert quiet.request.tenant_id == "alice" and not blocked.done()
    slots[0].release()
    assert (await asyncio.wait_for(blocked, 1)).request.request_id == "c3"


async def test_capped_fair_choice_does_not_idle_a_free_slot() -> None:
    d = make(room=2)  # capacity 2: a tenant may hold 1
    held = await d.wait_turn(item(d, "c0", "carol"))
    carol_next = asyncio.create_task(d.wait_turn(item(d, "c1", "carol")))
    await asyncio.sleep(0.01)
    d.queue.charge("bob", 10_000)  # bob's counter is far above carol's: carol is the fair choice
    bob = await asyncio.wait_for(d.wait_turn(item(d, "b0", "bob")), 1)
    assert bob.request.tenant_id == "bob" and not carol_next.done()
    held.release()
    assert (await asyncio.wait_for(carol_next, 1)).request.request_id == "c1"


async def test_timeout_and_cancel_leave_nothing_behind() -> None:
    d = make(room=1, timeout=0.05)
    held = await d.wait_turn(item(d, "a0", "alice"))
    with pytest.raises(ServiceUnavailable):
        await d.wait_turn(item(d, "b0", "bob"))
    assert len(d.queue) == 0
    task = asyncio.create_task(d.wait_turn(item(d, "b1", "bob"), timeout_s=5))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(d.queue) == 0
    held.release()
    assert d.in_flight == 0


async def test_no_replicas_means_no_room() -> None:
    d = make(room=2, replicas=0, timeout=0.05)
    assert d.capacity == 0
    with pytest.raises(ServiceUnavailable):
        await d.wait_turn(item(d, "a0", "alice"))


async def test_reload_moves_waiting_requests() -> None:
    d = make(room=1)
    held = await d.wait_turn(item(d, "a0", "alice"))
    waiting = asyncio.create_task(d.wait_turn(item(d, "b0", "bob")))
    await asyncio.sleep(0.01)
    d.replace_queue(FairQueue.from_config(default_tenancy_config()))
    assert "b0" in d.queue
    held.release()
    assert (await asyncio.wait_for(waiting, 1)).request.request_id == "b0"


async def test_every_structure_is_bounded_by_what_waits_or_runs() -> None:
    """Issue 19, defect 3: request ids were kept per tenant until the uncapped path pruned them,
    which a balanced cluster never reaches. After any mix of grants, timeouts and cancels, nothing
    is left behind."""
    d = make(room=8, timeout=0.05)
    for i in range(200):  # a balanced cluster: every request is granted at once
        (await d.wait_turn(item(d, f"r{i}", ("alice", "bob", "carol")[i % 3]))).release()
    held = [await d.wait_turn(item(d, f"h{i}", "alice" if i % 2 else "bob")) for i in range(8)]
    with pytest.raises(ServiceUnavailable):
        await d.wait_turn(item(d, "late", "carol"))
    task = asyncio.create_task(d.wait_turn(item(d, "gone", "carol"), timeout_s=5))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for slot in held:
        slot.release()
    assert d.in_flight == 0 and d.waiters == 0 and len(d.queue) == 0
    assert d.tracked_ids == 0
