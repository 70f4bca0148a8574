"""Lifts across routers (``share_lifts``, off by default): a lift made on one router reaches the
others, once (offsets merge by maximum), so every router ranks a returning tenant on the same
counter; in memory and in Redis. Without it, lifts stay on the router that made them."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from tenancy import FairQueue, FairShareSettings, TenantPolicy
from tenancy.counter_sync import CounterTotals, MemoryCounters
from tenancy.shared_counters import SharedCounters
from tests.tenancy.helpers import SYNC_TIMEOUT_S

POLICIES = {
    t: TenantPolicy(weight=1.0, tier=1, sla_class="batch", ttft_target_s=600.0, may_preempt=False)
    for t in ("f", "g", "h")
}


def _queue() -> FairQueue:
    return FairQueue(POLICIES, FairShareSettings(), clock=lambda: 0.0)


def _push(q: FairQueue, tenant: str, rid: str, prompt: int) -> None:
    q.push(q.make_request(rid, tenant, prompt, 0))


def _served(q: FairQueue, tokens: int, tenant: str) -> None:
    """``tenant`` is served ``tokens`` on router ``q`` and has one more request waiting there."""
    _push(q, tenant, f"{tenant}-{id(q)}-0", tokens)
    assert q.pop_next().tenant_id == tenant
    _push(q, tenant, f"{tenant}-{id(q)}-1", 10)


def _returns_on_both(share_lifts: bool) -> tuple[FairQueue, FairQueue]:
    """g is served 500 on each router and waits on both; A has not yet credited B's 500 when f
    returns from idle on both routers, so A lifts f to 500 and B to 1000. Then all sync."""
    totals = CounterTotals()
    a, b = _queue(), _queue()
    sync_a, sync_b = MemoryCounters(totals, "a", share_lifts), MemoryCounters(totals, "b", share_lifts)
    _served(a, 500, "g")
    _served(b, 500, "g")
    sync_a.sync(a)
    sync_b.sync(b)
    assert (a.counter("g"), b.counter("g")) == (500.0, 1000.0)
    _push(a, "f", "f-a", 10)
    _push(b, "f", "f-b", 10)
    assert (a.counter("f"), b.counter("f")) == (500.0, 1000.0)
    for sync, q in ((sync_a, a), (sync_b, b), (sync_a, a)):
        sync.sync(q)
    return a, b


def test_routers_rank_a_lifted_tenant_on_one_counter() -> None:
    a, b = _returns_on_both(share_lifts=True)
    assert a.counter("f") == b.counter("f") == a.counter("g") == 1000.0
    assert a.pop_next().tenant_id == "g"  # tie with f; g has waited longer


def test_lifts_kept_local_leave_the_routers_apart() -> None:
    """The default, and the failure mode: A keeps its own lower lift and serves f ahead of g."""
    a, b = _returns_on_both(share_lifts=False)
    assert (a.counter("f"), b.counter("f"), a.counter("g")) == (500.0, 1000.0, 1000.0)
    assert a.pop_next().tenant_id == "f"


def test_the_same_return_lifted_on_two_routers_is_raised_once() -> None:
    totals = CounterTotals()
    a, b = _queue(), _queue()
    sync_a, sync_b = MemoryCounters(totals, "a", True), MemoryCounters(totals, "b", True)
    _served(a, 1000, "g")
    _served(b, 1000, "h")
    for sync, q in ((sync_a, a), (sync_b, b), (sync_a, a)):
        sync.sync(q)
    _push(a, "f", "f-a", 10)  # lifted to g's 1000 on A
    _push(b, "f", "f-b", 10)  # lifted to h's 1000 on B
    for _ in range(2):
        for sync, q in ((sync_a, a), (sync_b, b)):
            sync.sync(q)
    assert totals.offsets == {"f": 1000.0}
    assert a.counter("f") == b.counter("f") == 1000.0  # added, it would be 2000


async def test_a_lift_travels_through_redis_once(redis_url: str, redis_prefix: str) -> None:
    client = Redis.from_url(redis_url)
    a, b = _queue(), _queue()
    share_a = SharedCounters(client, redis_prefix, share_lifts=True, op_timeout=SYNC_TIMEOUT_S)
    share_b = SharedCounters(client, redis_prefix, share_lifts=True, op_timeout=SYNC_TIMEOUT_S)
    _served(a, 1000, "g")
    for share, q in ((share_a, a), (share_b, b)):
        assert await share.sync(q)
    _push(a, "f", "f-a", 10)  # f returns from idle: lifted to g's 1000 on A (offset 1000)
    exchange = share_a._exchange

    async def reply_lost(mine: dict[str, float]) -> None:
        await exchange(mine)  # applied in Redis, then the reply times out
        raise TimeoutError

    share_a._exchange = reply_lost
    assert not await share_a.sync(a)
    share_a._exchange = exchange
    assert await share_a.sync(a)  # the same offset again: kept by maximum
    assert await share_b.sync(b)
    assert b.counter("f") == pytest.approx(1000.0)  # B never saw f: its counter is A's lift
    assert a.counter("f") == 1000.0
    _push(b, "f", "f-b", 10)  # f's first request on B: B's own level is 0, no lower lift
    assert b.counter("f") == pytest.approx(1000.0)
    await client.aclose()


async def test_lifts_stay_local_by_default(redis_url: str, redis_prefix: str) -> None:
    client = Redis.from_url(redis_url)
    a, b = _queue(), _queue()
    share_a, share_b = (SharedCounters(client, redis_prefix, op_timeout=SYNC_TIMEOUT_S) for _ in range(2))
    _served(a, 1000, "g")
    _push(a, "f", "f-a", 10)  # lifted to 1000 on A
    for share, q in ((share_a, a), (share_b, b)):
        assert await share.sync(q)
    assert b.counter("f") == 0.0 and a.counter("f") == 1000.0
    await client.aclose()
