"""The Redis store against real Redis servers: sharing, TTLs, races between processes, outages."""

from __future__ import annotations

import asyncio
import multiprocessing
import time

import pytest
import redis

from tenancy import LimitSpec, QuotaExceeded, QuotaManager, RedisQuotaStore
from tests.redis_server import RedisProcess
from tests.tenancy.helpers import FakeClock, make_config, tenant
from tests.tenancy.redis_hammer import hammer

CONFIG = make_config(
    tenant("acme", requests_per_minute=600, tokens_per_minute=60_000, max_concurrent_requests=4)
)


def store(url: str, prefix: str, clock: FakeClock, **kwargs: object) -> RedisQuotaStore:
    return RedisQuotaStore.from_url(
        url, prefix=prefix, clock=clock, shared_clock=clock, **{"op_timeout": 1.0, **kwargs}
    )


async def test_keys_are_namespaced_hash_tagged_and_expire(redis_url: str, redis_prefix: str) -> None:
    clock = FakeClock()
    s = store(redis_url, redis_prefix, clock)
    manager = QuotaManager(make_config(tenant("acme", daily_token_budget=10_000)), s, clock=clock)
    await manager.admit("acme", 10, 10)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    keys = sorted(client.scan_iter(match=f"{redis_prefix}:*"))
    assert [k.split(":")[1] for k in keys] == ["{acme}"] * 5  # rpm, tpm, conc, budget, the request's mark
    assert all(client.pttl(k) > 0 for k in keys)
    assert not any("sk-" in k for k in keys)
    client.close()
    await s.close()


async def test_two_routers_share_concurrency(redis_url: str, redis_prefix: str) -> None:
    clock = FakeClock()
    a = QuotaManager(CONFIG, store(redis_url, redis_prefix, clock), clock=clock)
    b = QuotaManager(CONFIG, store(redis_url, redis_prefix, clock), clock=clock)
    leases = [
        await a.admit("acme", 1, 1),
        await b.admit("acme", 1, 1),
        await a.admit("acme", 1, 1),
        await b.admit("acme", 1, 1),
    ]
    with pytest.raises(QuotaExceeded) as info:
        await a.admit("acme", 1, 1)
    assert info.value.reason == "concurrency"
    assert await b.release(leases[0], 1)  # released by another router than the one that admitted
    await a.admit("acme", 1, 1)
    await a.store.close()
    await b.store.close()


async def test_crashed_router_slots_expire_and_renew_keeps_them(redis_url: str, redis_prefix: str) -> None:
    clock = FakeClock()
    crashed = QuotaManager(CONFIG, store(redis_url, redis_prefix, clock, lease_ttl=30.0), clock=clock)
    alive = QuotaManager(CONFIG, store(redis_url, redis_prefix, clock, lease_ttl=30.0), clock=clock)
    kept = await alive.admit("acme", 1, 1)
    for _ in range(3):
        await crashed.admit("acme", 1, 1)  # never released: the router "crashes"
    with pytest.raises(QuotaExceeded):
        await alive.admit("acme", 1, 1)
    clock.advance(20.0)
    assert await alive.renew(kept)
    clock.advance(15.0)  # crashed leases are 35 s old (> TTL 30 s); the renewed one is 15 s old
    got = [await alive.admit("acme", 1, 1) for _ in range(3)]
    assert len(got) == 3
    with pytest.raises(QuotaExceeded):
        await alive.admit("acme", 1, 1)
    await crashed.store.close()
    await alive.store.close()


def run_processes(
    redis_url: str, prefix: str, limits: LimitSpec, fixed_now: float | None
) -> tuple[int, float]:
    ctx = multiprocessing.get_context("spawn")
    start = time.time()
    with ctx.Pool(4) as pool:
        results = pool.starmap(hammer, [(redis_url, prefix, limits, 60, fixed_now)] * 4)
    assert all(degraded == 0 for _, degraded in results)
    return sum(admitted for admitted, _ in results), time.time() - start


def test_processes_racing_for_one_bucket_never_over_admit(redis_url: str, redis_prefix: str) -> None:
    # Frozen clock: no refill at all, so exactly the bucket size gets in across 4 x 60 attempts.
    rpm_total, _ = run_processes(redis_url, redis_prefix + "-rpm", LimitSpec(37, 10**9, 10**6), 5_000.0)
    assert rpm_total == 37
    conc_total, _ = run_processes(redis_url, redis_prefix + "-conc", LimitSpec(10**6, 10**9, 7), 5_000.0)
    assert conc_total == 7
    tpm_total, _ = run_processes(redis_url, redis_prefix + "-tpm", LimitSpec(10**6, 255, 10**6), 5_000.0)
    assert tpm_total == 25  # 10 tokens each


def test_processes_with_real_clock_stay_within_one_refill(redis_url: str, redis_prefix: str) -> None:
    rpm = 120  # 2 requests per second refill
    admitted, elapsed = run_processes(redis_url, redis_prefix + "-real", LimitSpec(rpm, 10**9, 10**6), None)
    assert rpm <= admitted <= rpm + 2 * elapsed + 1


async def test_outage_degrades_to_local_limits_then_reconnects() -> None:
    server = RedisProcess().start()
    clock = FakeClock()
    s = RedisQuotaStore.from_url(
        server.url,
        prefix="outage",
        clock=clock,
        shared_clock=clock,
        op_timeout=0.1,
        retry_interval=5.0,
        fallback_fraction=0.5,
    )
    manager = QuotaManager(CONFIG, s, clock=clock)
    try:
        shared = await manager.admit("acme", 1, 1)
        assert shared.backend == "redis" and not s.degraded
        server.kill()

        started = time.monotonic()
        local = await manager.admit("acme", 1, 1)
        assert time.monotonic() - started < 0.5
        assert local.backend == "local" and s.degraded and "redis unreachable" in (s.degraded_reason or "")
        await manager.admit("acme", 1, 1)  # local share: 4 x 0.5 = 2 slots
        with pytest.raises(QuotaExceeded):
            await manager.admit("acme", 1, 1)
        assert await manager.release(shared, 1)  # queued until Redis is back
        assert s.pending_releases == 1
        assert await manager.release(local, 1)

        server.start()
        assert s.degraded  # no probe before retry_interval
        clock.advance(5.0)
        again = await manager.admit("acme", 1, 1)  # served locally, starts the background probe
        assert again.backend == "local"
        for _ in range(100):
            if not s.degraded:
                break
            await asyncio.sleep(0.01)
        assert not s.degraded and s.degraded_reason is None and s.pending_releases == 0
        back = await manager.admit("acme", 1, 1)
        assert back.backend == "redis"
    finally:
        server.kill()
        await s.close()


async def test_unreachable_from_the_start_never_blocks_long() -> None:
    clock = FakeClock()
    dead = RedisProcess()  # never started: nothing listens on its port
    s = RedisQuotaStore.from_url(dead.url, prefix="dead", clock=clock, op_timeout=0.05)
    manager = QuotaManager(CONFIG, s, clock=clock)
    started = time.monotonic()
    leases = [await manager.admit("acme", 1, 1) for _ in range(3)]
    assert time.monotonic() - started < 0.5
    assert s.degraded and {lease.backend for lease in leases} == {"local"}
    assert await s.probe() is False
    await s.close()


async def test_probe_loads_the_scripts_a_restarted_redis_lost() -> None:
    """A fresh or restarted Redis has no scripts: the probe (also the router's warm-up) sends them, so
    the first acquires after it take one round trip, not three (NOSCRIPT, SCRIPT LOAD, EVALSHA)."""
    server = RedisProcess().start()
    s = store(server.url, "scripts", FakeClock())
    plain = redis.Redis.from_url(server.url)
    shas = [script.sha for script in (s._acquire, s._release, s._renew, s._debit)]
    try:
        assert await s.probe()
        assert plain.script_exists(*shas) == [True] * 4
        server.kill()
        server.start()
        assert plain.script_exists(*shas) == [False] * 4
        assert await s.probe()
        assert plain.script_exists(*shas) == [True] * 4 and not s.degraded
    finally:
        plain.close()
        server.kill()
        await s.close()
