"""The simulator's in-memory counter exchange gives every router the counters Redis gives it."""

from __future__ import annotations

import random

import pytest
from redis.asyncio import Redis

from tenancy import FairQueue, FairShareSettings, TenantPolicy
from tenancy.counter_sync import CounterTotals, MemoryCounters
from tenancy.shared_counters import SharedCounters
from tests.tenancy.helpers import SYNC_TIMEOUT_S

TENANTS = ("alice", "bob", "carol")
POLICIES = {
    t: TenantPolicy(weight=w, tier=1, sla_class="standard", ttft_target_s=60.0, may_preempt=False)
    for t, w in zip(TENANTS, (1.0, 2.0, 0.5), strict=True)
}


def _queue() -> FairQueue:
    return FairQueue(POLICIES, FairShareSettings(), clock=lambda: 0.0)


@pytest.mark.parametrize("share_lifts", [False, True])
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_memory_exchange_matches_redis_on_the_same_charges(
    redis_url: str, redis_prefix: str, seed: int, share_lifts: bool
):
    rng = random.Random(seed)
    client = Redis.from_url(redis_url)
    routers = 3
    on_redis, in_memory = [_queue() for _ in range(routers)], [_queue() for _ in range(routers)]
    shared = [
        SharedCounters(client, redis_prefix, share_lifts=share_lifts, op_timeout=SYNC_TIMEOUT_S)
        for _ in range(routers)
    ]
    totals = CounterTotals()
    memory = [MemoryCounters(totals, f"r{k}", share_lifts) for k in range(routers)]
    popped: list[list] = [[] for _ in range(routers)]
    for step in range(300):
        k = rng.randrange(routers)
        action = rng.random()
        if action < 0.4:  # a request arrives on router k (a lift when its lane was empty)
            tenant = rng.choice(TENANTS)
            prompt, max_tokens = rng.randint(1, 500), rng.randint(1, 200)
            for q in (on_redis[k], in_memory[k]):
                q.push(q.make_request(f"{step}", tenant, prompt, max_tokens))
        elif action < 0.7:  # router k dispatches (charges the reservation)
            got = [q.pop_next() for q in (on_redis[k], in_memory[k])]
            assert (got[0] is None) == (got[1] is None)
            if got[0] is not None:
                assert got[0].request_id == got[1].request_id
                popped[k].append((got[0], got[1]))
        elif action < 0.85 and popped[k]:  # a request ends: its settlement refunds unused output
            first, second = popped[k].pop(rng.randrange(len(popped[k])))
            output = rng.randint(0, first.max_tokens)
            on_redis[k].settle(first, output)
            in_memory[k].settle(second, output)
        else:  # router k syncs
            assert await shared[k].sync(on_redis[k])
            memory[k].sync(in_memory[k])
            for q_redis, q_memory in zip(on_redis, in_memory, strict=True):
                for tenant in TENANTS:
                    assert q_memory.counter(tenant) == pytest.approx(
                        q_redis.counter(tenant), rel=1e-12, abs=1e-9
                    )
    assert bool(totals.offsets) == share_lifts  # lifts were made (pushes to empty lanes) and shared
    await client.aclose()


def test_a_batch_published_again_is_applied_once():
    totals = CounterTotals()
    assert totals.publish("r0", 1, {"alice": 5.0}) == {"alice": 5.0}
    assert totals.publish("r0", 1, {"alice": 5.0}) == {"alice": 5.0}  # the retry of a lost reply
    assert totals.publish("r1", 1, {"alice": 2.0}) == {"alice": 7.0}
