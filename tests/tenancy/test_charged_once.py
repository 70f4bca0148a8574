"""A call whose reply is lost (a timeout after Redis ran the script) is retried without a second
charge, against a real Redis server: acquire, release and debit are idempotent per request id,
token buckets run on Redis's clock, and a Redis restart does not flap the store."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from cluster.routing.reconciling_store import ReconcilingStore
from tenancy import LimitSpec, MemoryQuotaStore, RedisQuotaStore
from tenancy.store import day_of
from tests.redis_server import RedisProcess

RPM, TPM = 60, 6_000
LIMITS = LimitSpec(RPM, TPM, 10, daily_token_budget=100_000)


class LostReply:
    """A store's script whose next ``lose`` replies are lost after Redis ran it (a timeout). The store
    sends a timed-out call once more (``redis_calls``), so two lost replies reach its fallback."""

    def __init__(self, script, lose: int = 2) -> None:
        self.script, self.lose = script, lose

    async def __call__(self, **kwargs):
        result = await self.script(**kwargs)
        if self.lose:
            self.lose -= 1
            raise TimeoutError
        return result


def make_store(url: str, prefix: str, **kwargs) -> RedisQuotaStore:
    options = {"op_timeout": 1.0, "retry_interval": 3600.0} | kwargs
    return RedisQuotaStore.from_url(url, prefix=prefix, **options)


def shared_state(url: str, store: RedisQuotaStore, tenant: str = "t") -> dict:
    """What Redis holds for ``tenant``: requests and tokens charged, slots held, budget used."""
    client = redis.Redis.from_url(url, decode_responses=True)
    rpm, tpm, conc, budget = store.keys(tenant, day_of(time.time()))
    level = lambda key, cap: cap - float(client.hget(key, "l") or cap)  # noqa: E731
    state = {
        "requests": round(level(rpm, RPM), 3),
        "tokens": round(level(tpm, TPM)),
        "slots": client.zrange(conc, 0, -1),
        "budget": int(client.get(budget) or 0),
    }
    client.close()
    return state


async def test_a_repeated_acquire_charges_once(redis_url: str, redis_prefix: str) -> None:
    store = make_store(redis_url, redis_prefix)
    first = await store.acquire("t", LIMITS, "req-1", 100)
    again = await store.acquire("t", LIMITS, "req-1", 100)
    assert first.admitted and again.admitted
    state = shared_state(redis_url, store)
    assert state["requests"] == pytest.approx(1, abs=0.01) and state["tokens"] == pytest.approx(100, abs=1)
    assert state["slots"] == ["req-1"] and state["budget"] == 100
    await store.close()
    memory = MemoryQuotaStore()  # the same contract without Redis
    assert (await memory.acquire("t", LIMITS, "r", 100)).admitted
    assert (await memory.acquire("t", LIMITS, "r", 100)).state.requests_remaining == RPM - 1


async def test_one_lost_reply_is_sent_again_and_charged_once(redis_url: str, redis_prefix: str) -> None:
    store = make_store(redis_url, redis_prefix)
    store._acquire = LostReply(store._acquire, lose=1)
    result = await store.acquire("t", LIMITS, "req-1", 100)  # ran, reply lost, sent again: marked
    assert result.admitted and result.backend == "redis" and not store.degraded
    state = shared_state(redis_url, store)
    assert state["requests"] == pytest.approx(1, abs=0.01) and state["slots"] == ["req-1"], state
    await store.close()


async def test_an_acquire_whose_reply_is_lost_is_charged_once_and_leaves_no_slot(
    redis_url: str, redis_prefix: str
) -> None:
    inner = make_store(redis_url, redis_prefix)
    store = ReconcilingStore(inner)
    inner._acquire = LostReply(inner._acquire)
    result = await store.acquire("t", LIMITS, "req-1", 100)  # ran in Redis, timed out twice
    assert result.admitted and result.backend == "local" and inner.degraded
    assert await store.probe() and not inner.degraded  # Redis answers: the local admission is debited
    state = shared_state(redis_url, inner)
    # Before: the phantom slot stayed for the lease TTL (900 s) and the request was charged twice.
    assert state["slots"] == [], state
    assert state["requests"] == pytest.approx(1, abs=0.01) and state["tokens"] == pytest.approx(100, abs=1)
    assert state["budget"] == 100, state
    await store.close()


async def test_a_debit_whose_reply_is_lost_is_charged_once(redis_url: str, redis_prefix: str) -> None:
    inner = make_store(redis_url, redis_prefix)
    store = ReconcilingStore(inner)
    inner._degraded_reason = "redis unreachable: test"  # admissions go local, as in an outage
    inner._next_probe_at = time.time() + 3600
    for i in range(3):
        assert (await store.acquire("t", LIMITS, f"local-{i}", 10)).backend == "local"
    inner._debit = LostReply(inner._debit)
    await store.probe()  # Redis answers; the debit runs there, its reply is lost: owed again
    assert store.reconciled == 0 and inner.degraded
    assert await store.probe() and not inner.degraded  # the second try
    assert store.reconciled == 3
    state = shared_state(redis_url, inner)
    # 3 local admissions of 10 tokens, charged once (before: twice, 6 requests and 60 tokens).
    assert state["requests"] == pytest.approx(3, abs=0.01) and state["tokens"] == pytest.approx(30, abs=1)
    assert state["budget"] == 30
    await store.close()


async def test_a_release_whose_reply_is_lost_refunds_once(redis_url: str, redis_prefix: str) -> None:
    store = make_store(redis_url, redis_prefix)
    from tenancy import QuotaManager
    from tests.tenancy.helpers import make_config, tenant

    manager = QuotaManager(make_config(tenant("t", tokens_per_minute=TPM)), store)
    lease = await manager.admit("t", 100, 400)  # 500 reserved
    store._release = LostReply(store._release)
    assert await manager.release(lease, 100)  # used 200: refund 300, reply lost, queued
    assert store.pending_releases == 1
    assert await store.probe() and store.pending_releases == 0  # replayed: refunds nothing more
    assert shared_state(redis_url, store)["tokens"] == pytest.approx(200, abs=1)
    await store.close()


async def test_buckets_run_on_redis_time_not_the_routers_clocks(redis_url: str, redis_prefix: str) -> None:
    behind = make_store(redis_url, redis_prefix)
    ahead = make_store(redis_url, redis_prefix, clock=lambda: time.time() + 30.0)  # a skewed router
    limits = LimitSpec(RPM, TPM, 1_000)
    admitted = [(await behind.acquire("t", limits, f"b{i}", 1)).admitted for i in range(RPM)]
    assert all(admitted)
    # The bucket is empty. With each router's own clock, the one 30 s ahead saw 30 s of refill
    # (30 requests); on Redis's clock it sees the ~0 s that really passed.
    ahead_admitted = sum([(await ahead.acquire("t", limits, f"a{i}", 1)).admitted for i in range(RPM)])
    assert ahead_admitted <= 2, ahead_admitted
    await behind.close()
    await ahead.close()


async def test_a_redis_restart_does_not_flap_the_store() -> None:
    server = RedisProcess().start()
    store = make_store(server.url, "restart", op_timeout=0.5)
    try:
        limits = LimitSpec(10_000, 10**9, 10_000)
        await asyncio.gather(*(store.acquire("t", limits, f"warm-{i}", 1) for i in range(16)))  # 16 pooled
        server.kill()
        server.start()
        assert (await store.acquire("t", limits, "first", 1)).backend == "local"  # the restart is seen
        assert await store.probe() and not store.degraded
        # Before: each of the other pooled connections was dead and failed one call, sending the store
        # back to degraded mode (local limits) until the next probe, again and again.
        results = await asyncio.gather(*(store.acquire("t", limits, f"after-{i}", 1) for i in range(16)))
        assert [r.backend for r in results] == ["redis"] * 16
        assert not store.degraded
    finally:
        await store.close()
        server.kill()
