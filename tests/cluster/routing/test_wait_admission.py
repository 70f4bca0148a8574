"""Admission by expected wait: a request that its tenant's backlog would keep waiting past the queue's
time bound gets a 429 at once, not a 503 a minute later; a quiet tenant beside that backlog is
admitted; a router that has not yet seen its queue drain admits as before (the dispatcher alone,
on a clock the test moves)."""

from __future__ import annotations

import asyncio

import pytest

from cluster.errors import classify
from cluster.routing.dispatcher import Dispatcher, DispatchSlot
from cluster.routing.drain_rate import MIN_INTERVALS, DrainRate
from tenancy import FairQueue, QueueWaitTooLong, default_tenancy_config

TIMEOUT_S = 10.0
END_EVERY_S = 2.0  # the replica frees a slot every 2 s while the queue holds work: 0.5 req/s


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(clock: Clock) -> Dispatcher:
    queue = FairQueue.from_config(default_tenancy_config(), clock=clock)
    return Dispatcher(queue, room_per_replica=1, queue_timeout_s=TIMEOUT_S)


def item(d: Dispatcher, rid: str, tenant: str):
    return d.queue.make_request(rid, tenant, 10, 8)


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def backlog(d: Dispatcher, tenant: str, n: int) -> list[asyncio.Task[DispatchSlot]]:
    tasks = [asyncio.create_task(d.wait_turn(item(d, f"{tenant}{i}", tenant))) for i in range(n)]
    await settle()
    return tasks


async def drain(d: Dispatcher, clock: Clock, held: DispatchSlot, tasks, ends: int) -> DispatchSlot:
    """``ends`` slot ends, END_EVERY_S apart, each handing the slot to the next waiter."""
    for _ in range(ends):
        clock.now += END_EVERY_S
        held.release()
        await settle()
        held = next(t.result() for t in tasks if t.done() and not t.result().released)
    return held


def test_the_drain_rate_counts_only_the_busy_spells() -> None:
    rate = DrainRate(window=4, min_intervals=3)
    rate.became_busy(0.0)
    for t in (1.0, 2.0):
        rate.slot_ended(t)
    assert rate.per_s() is None  # two intervals: too few to tell
    rate.became_idle()  # a slot stayed free: the 98 s until the next spell count nowhere
    rate.became_busy(100.0)
    rate.became_busy(100.2)  # already busy: the spell keeps its start
    for t in (100.5, 101.0):
        rate.slot_ended(t)
    assert rate.per_s() == pytest.approx(4 / 3.0)  # 1 s, 1 s, 0.5 s, 0.5 s
    assert rate.expected_wait_s(waiting=3, share=0.5) == pytest.approx((1 + 6) / (4 / 3.0))
    rate.slot_ended(101.1)  # the window keeps the last 4
    assert rate.per_s() == pytest.approx(4 / 2.1)


def test_the_wait_share_counts_the_weights_of_the_tenants_waiting() -> None:
    queue = FairQueue.from_config(default_tenancy_config())
    assert queue.waiting_share("carol") == (0, 1.0)
    queue.push(queue.make_request("c0", "carol", 10, 8))
    queue.push(queue.make_request("c1", "carol", 10, 8))
    assert queue.waiting_share("carol") == (2, 1.0)
    assert queue.waiting_share("alice") == (0, pytest.approx(2 / 3))  # weight 2 beside carol's 1
    queue.push(queue.make_request("b0", "bob", 10, 8))
    assert queue.waiting_share("carol") == (2, pytest.approx(1 / 2))
    for rid in ("c0", "c1", "b0"):
        queue.remove(rid)
    assert queue.waiting_share("alice") == (0, 1.0)


async def test_a_backlog_past_the_bound_is_refused_at_once_and_a_quiet_tenant_is_admitted() -> None:
    clock = Clock()
    d = make(clock)
    held = await d.wait_turn(item(d, "c-held", "carol"))
    tasks = await backlog(d, "carol", MIN_INTERVALS + 8)
    held = await drain(d, clock, held, tasks, MIN_INTERVALS + 1)
    waiting = len(d.queue)
    assert d.expected_wait_s("carol") == pytest.approx((1 + waiting) * END_EVERY_S)
    assert (1 + waiting) * END_EVERY_S > TIMEOUT_S  # the test's backlog does outlast the bound

    with pytest.raises(QueueWaitTooLong) as refused:
        await d.wait_turn(item(d, "c-late", "carol"))
    assert "c-late" not in d.queue and len(d.queue) == waiting  # refused before it was queued
    info = classify(refused.value)
    assert (info.status, info.code) == (429, "queue_full_wait")
    assert int(info.headers["retry-after"]) >= max(1, int((1 + waiting) * END_EVERY_S - TIMEOUT_S))

    # alice (weight 2) has nothing waiting: her request takes the next slot at her share.
    assert d.expected_wait_s("alice") == pytest.approx(END_EVERY_S)
    quiet = asyncio.create_task(d.wait_turn(item(d, "a0", "alice")))
    await settle()
    assert "a0" in d.queue and not quiet.done()
    clock.now += END_EVERY_S
    held.release()
    assert (await asyncio.wait_for(quiet, 1)).request.tenant_id == "alice"
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_the_pace_of_a_closed_loop_that_keeps_the_room_full_counts_and_idle_time_does_not() -> None:
    clock = Clock()
    d = make(clock)
    for i in range(MIN_INTERVALS):  # one request at a time, each sent as the last ends
        held = await d.wait_turn(item(d, f"b{i}", "bob"))
        clock.now += END_EVERY_S
        held.release()
        clock.now += 30.0  # the client thinks for 30 s: a free slot, nothing waiting
    assert d.expected_wait_s("bob") == 0.0  # nothing waits
    held = await d.wait_turn(item(d, "b-last", "bob"))
    tasks = await backlog(d, "carol", 3)
    # each spell (grant -> end) was one 2-s interval; the 30-s pauses count nowhere
    assert d.expected_wait_s("carol") == pytest.approx((1 + 3) * END_EVERY_S)  # carol alone waits
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    held.release()


async def test_a_router_that_has_not_seen_its_pace_admits_a_deep_backlog() -> None:
    clock = Clock()
    d = make(clock)
    held = await d.wait_turn(item(d, "c-held", "carol"))
    tasks = await backlog(d, "carol", 40)
    assert d.expected_wait_s("carol") is None
    late = asyncio.create_task(d.wait_turn(item(d, "c-late", "carol")))
    await settle()
    assert "c-late" in d.queue and not late.done()
    for t in [*tasks, late]:
        t.cancel()
    await asyncio.gather(*tasks, late, return_exceptions=True)
    held.release()
    assert d.in_flight == 0 and len(d.queue) == 0
