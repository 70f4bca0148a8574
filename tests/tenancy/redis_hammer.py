"""Worker for the multi-process Redis test (a module of its own so spawned children import little)."""

from __future__ import annotations

import asyncio

from tenancy import LimitSpec, RedisQuotaStore


def hammer(
    url: str, prefix: str, limits: LimitSpec, attempts: int, fixed_now: float | None
) -> tuple[int, int]:
    """Try ``attempts`` admissions of one tenant as fast as possible; (admitted, degraded count)."""
    return asyncio.run(_hammer(url, prefix, limits, attempts, fixed_now))


async def _hammer(
    url: str, prefix: str, limits: LimitSpec, attempts: int, fixed_now: float | None
) -> tuple[int, int]:
    shared_clock = (lambda: fixed_now) if fixed_now is not None else None  # None: Redis's TIME
    store = RedisQuotaStore.from_url(url, prefix=prefix, shared_clock=shared_clock, op_timeout=2.0)
    admitted = degraded = 0
    try:
        for i in range(attempts):
            result = await store.acquire("hot", limits, f"{id(store)}-{i}", 10)
            admitted += result.admitted
            degraded += result.backend != "redis"
    finally:
        await store.close()
    return admitted, degraded
