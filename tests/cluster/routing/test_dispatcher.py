"""The dispatcher alone (no Ray): fair order, room, per-tenant cap, timeouts and cancellation."""

from __future__ import annotations

import asyncio

import pytest

from cluster.errors import ServiceUnavailable
from cluster.routing.dispatcher import Dispatcher
from tenancy import FairQueue, default_tenancy_config


def make(room: int = 2, replicas: int = 1, timeout: float = 5.0, order: str = "fairlane") -> Dispatcher:
    queue = FairQueue.from_config(default_tenancy_config(), order=order)
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
    """Issue 19, defect 3: request ids were kept per tenant until a pruning path ran, which a
    balanced cluster never reaches. After any mix of grants, timeouts and cancels, nothing
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


async def test_capped_fair_choice_is_skipped_by_the_queue_and_the_pick_is_charged() -> None:
    d = make(room=2)  # capacity 2: a tenant may hold 1
    held = await d.wait_turn(item(d, "c0", "carol"))
    carol_next = asyncio.create_task(d.wait_turn(item(d, "c1", "carol")))
    await asyncio.sleep(0.01)
    bob = await asyncio.wait_for(d.wait_turn(item(d, "b0", "bob", prompt=10)), 1)
    # bob returns from idle, is lifted to carol's counter (the smallest waiting), then charged
    reserved = 10 + 2 * 8
    assert bob.request.request_id == "b0" and d.queue.counter("carol") == reserved
    assert d.queue.counter("bob") == 2 * reserved
    held.release(8)
    assert (await asyncio.wait_for(carol_next, 1)).request.request_id == "c1"


async def test_release_settles_the_charge_with_output_and_cached_tokens() -> None:
    d = make(room=4)
    slot = await d.wait_turn(item(d, "b0", "bob", prompt=100))
    assert d.queue.counter("bob") == 100 + 2 * 8
    slot.release(output_tokens=3, cached_tokens=60)
    slot.release(output_tokens=8)  # a second release changes nothing
    assert d.queue.counter("bob") == pytest.approx(40 + 60 * 0.1 + 2 * 3)


async def test_fcfs_reserves_no_room_and_goes_by_arrival() -> None:
    d = make(room=4, order="fcfs")
    assert d.reserved == 0
    slots = [await d.wait_turn(item(d, f"c{i}", "carol")) for i in range(4)]  # all four slots
    late = [
        asyncio.create_task(d.wait_turn(item(d, rid, t))) for rid, t in (("a0", "alice"), ("c4", "carol"))
    ]
    await asyncio.sleep(0.01)
    slots[0].release()
    await asyncio.sleep(0.01)
    assert late[0].done() and not late[1].done()
    slots[1].release()
    assert (await asyncio.wait_for(late[1], 1)).request.request_id == "c4"


async def test_one_clock_read_per_kick() -> None:
    d = make(room=8)
    reads = 0
    clock = d.queue._clock

    def counting_clock() -> float:
        nonlocal reads
        reads += 1
        return clock()

    waiting = [asyncio.create_task(d.wait_turn(item(d, f"r{i}", ("alice", "bob")[i % 2]))) for i in range(6)]
    await asyncio.sleep(0)
    d.queue._clock = counting_clock
    d.set_replicas(2)  # one kick that pops whatever waits
    await asyncio.gather(*waiting)
    assert reads == 1


async def test_the_room_is_shared_over_the_routers_running_now() -> None:
    queue = FairQueue.from_config(default_tenancy_config())
    # No displacing: an interactive request would go past a full room (tested above).
    d = Dispatcher(queue, 8, num_routers=2, replicas=1, queue_timeout_s=5.0, displace=False)
    assert d.capacity == 4  # half of one replica's room of 8
    tenants = ("alice", "bob", "carol")
    waiting = [asyncio.create_task(d.wait_turn(item(d, f"r{i}", tenants[i % 3]))) for i in range(6)]
    await asyncio.sleep(0.01)
    assert d.in_flight == 4 and sum(w.done() for w in waiting) == 4
    d.set_routers(1)  # the other router stopped (scaled down): this one takes the whole room at once
    await asyncio.wait_for(asyncio.gather(*waiting), 1)
    assert d.capacity == 8 and d.in_flight == 6
    d.set_routers(4)  # two more joined: a smaller share; what is in flight stays
    assert d.capacity == 2 and d.in_flight == 6
    d.set_routers(0)  # never below one router
    assert d.capacity == 8


class _Handle:
    """Stands in for the replicas' DeploymentHandle: RouterCore only asks it for options here."""

    def options(self, **_: object) -> _Handle:
        return self


@pytest.mark.parametrize("policy", ["fcfs", "vtc", "fairlane"])
def test_app_config_dispatch_policy_reaches_every_pool_queue(policy: str) -> None:
    from cluster.config import AppConfig
    from cluster.routing.router_core import RouterCore

    core = RouterCore(AppConfig(engine={"device": "cpu"}, dispatch_policy=policy), _Handle())  # type: ignore[arg-type]
    (pool,) = core.pools.values()
    assert pool.dispatcher.queue.order == policy
    assert (pool.dispatcher.reserved == 0) == (policy == "fcfs")
    core.apply_tenancy(default_tenancy_config())  # a reload keeps the policy
    assert pool.dispatcher.queue.order == policy


def test_unknown_dispatch_policy_is_refused() -> None:
    from pydantic import ValidationError

    from cluster.config import AppConfig

    with pytest.raises(ValidationError, match="dispatch_policy"):
        AppConfig(dispatch_policy="lifo")


async def test_a_full_queue_refuses_the_longest_lane_not_a_quiet_tenant() -> None:
    from tenancy import FairShareSettings, QueueFull, policies_from_config

    config = default_tenancy_config()
    settings = FairShareSettings(max_queue_total=3)
    d = Dispatcher(FairQueue(policies_from_config(config), settings), 1, queue_timeout_s=5)
    held = await d.wait_turn(item(d, "c0", "carol"))
    noisy = [asyncio.create_task(d.wait_turn(item(d, f"c{i}", "carol"))) for i in range(1, 4)]
    await asyncio.sleep(0.01)
    quiet = asyncio.create_task(d.wait_turn(item(d, "a0", "alice")))
    await asyncio.sleep(0.01)
    with pytest.raises(QueueFull):  # carol's newest was pushed out for alice's
        await noisy[2]
    assert "a0" in d.queue and len(d.queue) == 3
    held.release()
    assert (await asyncio.wait_for(quiet, 1)).request.request_id == "a0"
    for task in noisy[:2]:
        task.cancel()


async def test_requests_on_a_stopping_replica_free_the_room_of_the_ones_that_stay() -> None:
    """Scale-down from two replicas to one while each runs two long streams: the two on the stopped
    replica must not hold the survivor's room, or a new request waits until they end."""
    d = make(room=2, replicas=2, timeout=0.5)  # capacity 4
    # The survivor runs alice's two (the top tier): bob's request has no lower tier to displace.
    slots = [await d.wait_turn(item(d, f"s{i}", "alice" if i < 2 else "carol")) for i in range(4)]
    for i, slot in enumerate(slots):
        slot.placed_on("r-stays" if i < 2 else "r-stops")
    d.set_live(frozenset({"r-stays", "r-stops"}))
    assert d.in_flight == 4
    d.set_replicas(1)
    d.set_live(frozenset({"r-stays"}))
    assert d.in_flight == 2  # the survivor's two; capacity is now 2 and full
    with pytest.raises(ServiceUnavailable):
        await d.wait_turn(item(d, "b0", "bob"))
    slots[2].release(output_tokens=5)  # a stream on the stopped replica ends: no room of the survivor
    assert d.in_flight == 2 and d.in_flight_of("carol") + d.in_flight_of("alice") == 2
    slots[0].release()
    bob = await asyncio.wait_for(d.wait_turn(item(d, "b1", "bob")), 1)
    assert bob.request.tenant_id == "bob" and d.in_flight == 2


async def test_a_request_placed_on_a_replica_already_stopping_takes_no_room() -> None:
    d = make(room=1, replicas=1, timeout=1.0)
    d.set_live(frozenset({"r-new"}))
    old = await d.wait_turn(item(d, "a0", "alice"))
    old.placed_on("r-old")  # its first output came from a replica that left the running set
    assert d.in_flight == 0
    new = await asyncio.wait_for(d.wait_turn(item(d, "b0", "bob")), 1)
    new.placed_on("r-new")
    assert d.in_flight == 1
    old.placed_on("r-new")  # retried onto the running replica: it holds room again
    assert d.in_flight == 2
    old.release()
    new.release()
    assert d.in_flight == 0 and d.in_flight_of("alice") == d.in_flight_of("bob") == 0


async def test_an_interactive_request_is_sent_past_a_room_full_of_lower_tiers() -> None:
    """The replica preempts its lowest tier for it (replica/scheduler.py): waiting here for a batch
    request to end would cost an interactive request a whole answer's time."""
    d = make(room=4)  # capacity 4; a quarter (1) may go past it
    held = [await d.wait_turn(item(d, f"c{i}", "carol")) for i in range(3)]
    held.append(await d.wait_turn(item(d, "b0", "bob")))
    assert d.in_flight == d.capacity == 4
    alice = await asyncio.wait_for(d.wait_turn(item(d, "a0", "alice")), 1)
    assert d.in_flight == 5 and d.displacing == 1
    second = asyncio.create_task(d.wait_turn(item(d, "a1", "alice")))
    bob = asyncio.create_task(d.wait_turn(item(d, "b1", "bob")))
    await asyncio.sleep(0.01)
    assert not second.done() and not bob.done()  # a quarter of the room at most goes past it
    held[0].release()  # still a full room, but one displacement is free again
    assert (await asyncio.wait_for(second, 1)).request.tenant_id == "alice" and not bob.done()
    for slot in held[1:]:
        slot.release()
    assert (await asyncio.wait_for(bob, 1)).request.request_id == "b1"
    alice.release()
    assert d.displacing == 0 and d.in_flight == 2  # alice's second and bob's


async def test_only_a_class_that_may_preempt_displaces_and_only_lower_tiers() -> None:
    d = make(room=2)  # capacity 2, one may go past it; a tenant may hold one
    await d.wait_turn(item(d, "a0", "alice"))
    await d.wait_turn(item(d, "b0", "bob"))
    carol = asyncio.create_task(d.wait_turn(item(d, "c0", "carol")))  # batch: may not preempt
    await asyncio.sleep(0.01)
    assert not carol.done() and d.displacing == 0
    carol.cancel()
    d2 = make(room=4)
    for i in range(3):
        await d2.wait_turn(item(d2, f"a{i}", "alice"))  # the top tier only: nothing to displace
    await d2.wait_turn(item(d2, "b0", "bob"))
    alice = asyncio.create_task(d2.wait_turn(item(d2, "a3", "alice")))
    await asyncio.sleep(0.01)
    assert not alice.done() and d2.displacing == 0
    alice.cancel()


@pytest.mark.parametrize("order", ["vtc", "fcfs"])
async def test_vtc_and_fcfs_never_send_past_the_room(order: str) -> None:
    d = make(room=4, order=order)
    for i in range(3):
        await d.wait_turn(item(d, f"c{i}", "carol"))
    await d.wait_turn(item(d, "b0", "bob"))
    alice = asyncio.create_task(d.wait_turn(item(d, "a0", "alice")))
    await asyncio.sleep(0.01)
    assert not alice.done() and d.in_flight == 4
    alice.cancel()
