"""Admission against quotas, for both stores (memory, and Redis through the real server)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tenancy import (
    MemoryQuotaStore,
    QuotaExceeded,
    QuotaManager,
    QuotaStore,
    RedisQuotaStore,
    RequestLimitExceeded,
)
from tests.tenancy.helpers import FakeClock, make_config, tenant

CONFIG = make_config(
    tenant("small", requests_per_minute=3, tokens_per_minute=600, max_concurrent_requests=2),
    tenant(
        "budget",
        requests_per_minute=100,
        tokens_per_minute=100_000,
        daily_token_budget=1000,
        max_concurrent_requests=50,
    ),
    tenant("big", requests_per_minute=1000, tokens_per_minute=1_000_000, max_concurrent_requests=100),
)
HEADER_NAMES = {
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(now=20_000 * 86_400 + 3_600.0)


@pytest_asyncio.fixture(params=["memory", "redis"])
async def manager(request: pytest.FixtureRequest, clock: FakeClock) -> AsyncIterator[QuotaManager]:
    store: QuotaStore
    if request.param == "memory":
        store = MemoryQuotaStore(clock=clock)
    else:
        url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")
        store = RedisQuotaStore.from_url(url, prefix=prefix, clock=clock, shared_clock=clock, op_timeout=1.0)
    yield QuotaManager(CONFIG, store, clock=clock)
    assert not store.degraded
    await store.close()


async def test_rpm_exhaustion_gives_retry_after_and_headers(manager: QuotaManager, clock: FakeClock) -> None:
    leases = [await manager.admit("small", 10, 10) for _ in range(2)]
    for lease in leases:
        assert await manager.release(lease, 10)
    await manager.admit("small", 10, 10)
    with pytest.raises(QuotaExceeded) as info:
        await manager.admit("small", 10, 10)
    exc = info.value
    assert exc.reason == "rpm" and exc.status_code == 429
    assert exc.retry_after == pytest.approx(20.0)  # 3/min refills one request every 20 s
    assert set(exc.headers) >= HEADER_NAMES
    assert exc.headers["x-ratelimit-limit-requests"] == "3"
    assert exc.headers["x-ratelimit-remaining-requests"] == "0"
    assert exc.headers["x-ratelimit-reset-requests"] == "1m0s"
    assert exc.headers["retry-after"] == "20"
    clock.advance(20.0)
    assert (await manager.admit("small", 10, 10)).tenant_id == "small"


async def test_concurrency_slots_and_idempotent_release(manager: QuotaManager) -> None:
    first = await manager.admit("small", 5, 5)
    second = await manager.admit("small", 5, 5)
    with pytest.raises(QuotaExceeded) as info:
        await manager.admit("small", 5, 5)
    assert info.value.reason == "concurrency" and info.value.retry_after > 0
    assert await manager.release(first, 0) is True
    assert await manager.release(first, 0) is False  # a second ending (abort after error) is harmless
    third = await manager.admit("small", 5, 5)
    assert third.lease_id not in {first.lease_id, second.lease_id}
    assert await manager.release(second, 0) and await manager.release(third, 0)
    assert not await manager.release(third, 0)


async def test_tpm_reserves_max_tokens_and_refunds_unused(manager: QuotaManager) -> None:
    lease = await manager.admit("small", 100, 400)  # reserves 500 of 600
    assert lease.headers["x-ratelimit-remaining-tokens"] == "100"
    await manager.release(lease, output_tokens=50)  # used 150: 350 refunded -> 450 left
    with pytest.raises(QuotaExceeded) as info:
        await manager.admit("small", 100, 400)
    assert info.value.reason == "tpm"
    assert info.value.headers["x-ratelimit-remaining-tokens"] == "450"
    assert info.value.retry_after == pytest.approx(50 / 10.0)  # 600/min = 10 tokens/s
    small = await manager.admit("small", 50, 400)
    assert small.headers["x-ratelimit-remaining-tokens"] == "0"


async def test_daily_budget(manager: QuotaManager, clock: FakeClock) -> None:
    lease = await manager.admit("budget", 300, 300)
    await manager.release(lease, 300)  # used 600 of 1000
    with pytest.raises(QuotaExceeded) as info:
        await manager.admit("budget", 200, 300)
    assert info.value.reason == "daily_budget"
    assert info.value.retry_after == pytest.approx(86_400 - 3_600.0)
    ok = await manager.admit("budget", 100, 300)  # 400 more fits exactly
    await manager.release(ok, 0)  # refund 300 -> 700 used
    again = await manager.admit("budget", 100, 200)
    await manager.release(again, 200)
    clock.advance(86_400)  # next day: fresh budget
    await manager.admit("budget", 300, 300)


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "limit"),
    [(10, 501, "max_tokens_per_request"), (600, 401, "max_context_length"), (-1, 5, "non_negative_tokens")],
)
async def test_per_request_limits(manager: QuotaManager, prompt: int, max_tokens: int, limit: str) -> None:
    with pytest.raises(RequestLimitExceeded) as info:
        await manager.admit("big", prompt, max_tokens)
    assert info.value.limit == limit and info.value.status_code == 400


async def test_request_larger_than_tpm_is_a_400_not_a_429() -> None:
    config = make_config(tenant("tiny", tokens_per_minute=100))
    tiny = QuotaManager(config, MemoryQuotaStore())
    with pytest.raises(RequestLimitExceeded) as info:
        await tiny.admit("tiny", 60, 60)
    assert info.value.limit == "tokens_per_minute" and info.value.maximum == 100


async def test_tenants_are_isolated(manager: QuotaManager) -> None:
    for _ in range(2):
        await manager.admit("small", 1, 1)
    with pytest.raises(QuotaExceeded):
        await manager.admit("small", 1, 1)
    lease = await manager.admit("big", 1, 1)
    assert lease.tenant_id == "big"


def test_sync_api_for_the_simulator() -> None:
    clock = FakeClock()
    manager = QuotaManager(CONFIG, MemoryQuotaStore(clock=clock), clock=clock)
    leases = [manager.admit_sync("small", 1, 1) for _ in range(2)]
    with pytest.raises(QuotaExceeded):
        manager.admit_sync("small", 1, 1)
    assert manager.release_sync(leases[0], 1) and not manager.release_sync(leases[0], 1)
    manager.admit_sync("small", 1, 1)


def test_sync_api_refuses_an_async_only_store(redis_url: str) -> None:
    manager = QuotaManager(CONFIG, RedisQuotaStore.from_url(redis_url))
    with pytest.raises(TypeError, match="no sync API"):
        manager.admit_sync("small", 1, 1)
