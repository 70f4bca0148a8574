"""Fair-share counters shared by two routers through a real Redis server."""

from __future__ import annotations

from redis.asyncio import Redis

from tenancy import FairQueue, FairShareSettings, TenantPolicy
from tenancy.shared_counters import SharedCounters
from tests.redis_server import RedisProcess, free_port
from tests.tenancy.helpers import SYNC_TIMEOUT_S

POLICIES = {
    "alice": TenantPolicy(weight=1.0, tier=1, sla_class="standard", ttft_target_s=60.0, may_preempt=False),
    "bob": TenantPolicy(weight=2.0, tier=1, sla_class="standard", ttft_target_s=60.0, may_preempt=False),
}


def _queue() -> FairQueue:
    return FairQueue(POLICIES, FairShareSettings(), clock=lambda: 0.0)


def _push(q: FairQueue, tenant: str, rid: str, prompt: int = 100) -> None:
    q.push(q.make_request(rid, tenant, prompt, 10))


async def test_service_on_one_router_counts_on_the_other(redis_url: str, redis_prefix: str) -> None:
    client = Redis.from_url(redis_url)
    router_a, router_b = _queue(), _queue()
    share_a, share_b = (SharedCounters(client, redis_prefix, op_timeout=SYNC_TIMEOUT_S) for _ in range(2))
    _push(router_a, "alice", "a1", prompt=300)
    assert router_a.pop_next().request_id == "a1"  # alice: 300 in + 10 out x 2 reserved = 320
    router_a.charge("alice", 40)  # 40 output tokens charged beyond it: 400 on router A
    # Both tenants are backlogged on router B; alice's request came first.
    _push(router_b, "alice", "a2")
    _push(router_b, "bob", "b1")
    assert router_b.peek_next().request_id == "a2"
    assert await share_a.sync(router_a)
    assert await share_b.sync(router_b)
    assert router_b.counter("alice") == 400.0
    # After the sync router B knows alice was served elsewhere and serves bob first.
    b1 = router_b.pop_next()
    assert b1.request_id == "b1"  # bob: (100 + 20) / weight 2 = 60 reserved
    router_b.settle(b1, output_tokens=10)  # it used all of it: nothing refunded
    assert await share_b.sync(router_b)
    assert await share_a.sync(router_a)
    assert router_a.counter("bob") == 60.0
    assert router_a.counter("alice") == 400.0, "a router's own service is not credited twice"
    await client.aclose()


async def test_redis_outage_keeps_the_growth_for_later() -> None:
    server = RedisProcess(free_port()).start()
    client = Redis.from_url(server.url, socket_timeout=0.05, socket_connect_timeout=0.05)
    router, other = _queue(), _queue()
    share, share_other = SharedCounters(client, "outage"), SharedCounters(client, "outage")
    _push(router, "alice", "a1", prompt=50)
    router.pop_next()  # 50 + 2 × 10 reserved
    server.kill()
    assert not await share.sync(router)
    assert share.degraded
    server = RedisProcess(server.port).start()
    try:
        assert await share.sync(router)
        assert not share.degraded
        assert await share_other.sync(other)
        assert other.counter("alice") == 70.0
    finally:
        await client.aclose()
        server.kill()


async def test_a_sync_whose_reply_is_lost_counts_once(redis_url: str, redis_prefix: str) -> None:
    client = Redis.from_url(redis_url)
    router, other = _queue(), _queue()
    share, share_other = (SharedCounters(client, redis_prefix, op_timeout=SYNC_TIMEOUT_S) for _ in range(2))
    _push(router, "alice", "a1", prompt=50)
    router.pop_next()  # alice: 50 + 2 × 10 = 70 on this router
    exchange = share._exchange

    async def reply_lost(mine: dict[str, float]) -> dict[str, float]:
        await exchange(mine)  # applied in Redis, then the reply times out
        raise TimeoutError

    share._exchange = reply_lost
    assert not await share.sync(router)
    share._exchange = exchange
    _push(router, "alice", "a2", prompt=10)
    router.pop_next()  # 30 more while the first batch is unconfirmed
    assert await share.sync(router)  # the first batch again (not applied twice), then the 30
    assert await share.sync(router)
    assert await share_other.sync(other)
    assert other.counter("alice") == 100.0  # before: 170 (the lost batch was published twice)
    assert router.counter("alice") == 100.0
    await client.aclose()
