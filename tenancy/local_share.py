"""What one router allows alone while Redis is away: its share of every limit, started from what
Redis last said.

Each limit is scaled by ``fraction`` (``LimitSpec.scaled``; set it to ``1 / routers``). The local
buckets do not start full: on entering degraded mode each starts from ``fraction`` of the levels
Redis reported in this router's last answer for that tenant (refilled from then on), so a tenant at
its quota when Redis went away gets no fresh burst, only the local refill; a tenant the router never
asked Redis about starts from a full share. Every local admission lowers the level remembered from
Redis (it will be debited there), and a seed never raises a bucket, so a store that keeps losing
Redis hands out its share once, not once per stall.
"""

from __future__ import annotations

from collections.abc import Callable

from tenancy.lease import Lease
from tenancy.memory_store import MemoryQuotaStore
from tenancy.store import AcquireResult, LimitSpec


class LocalShare:
    """The local fallback of ``RedisQuotaStore``: a memory store on scaled limits, seeded from Redis."""

    def __init__(self, clock: Callable[[], float], fraction: float, concurrency_retry_after: float) -> None:
        self._clock = clock
        self._fraction = fraction
        self._store = MemoryQuotaStore(clock, concurrency_retry_after, backend="local")
        # tenant -> (limits, requests level, tokens level, when): Redis's buckets at its last answer
        self._last_seen: dict[str, tuple[LimitSpec, float, float, float]] = {}

    def saw(self, tenant_id: str, limits: LimitSpec, requests: float, tokens: float) -> None:
        """Redis answered for ``tenant_id`` with these bucket levels."""
        self._last_seen[tenant_id] = (limits, requests, tokens, self._clock())

    def seed(self) -> None:
        """Entering degraded mode: every tenant's buckets from its share of what Redis last said."""
        f = self._fraction
        for tenant_id, (limits, requests, tokens, at) in self._last_seen.items():
            self._store.seed(tenant_id, limits.scaled(f), f * requests, f * tokens, at)

    def acquire(self, tenant_id: str, limits: LimitSpec, lease_id: str, tokens: int) -> AcquireResult:
        """Admission on this router's share. What it admits will be debited from Redis's buckets (the
        reconciliation), so the levels Redis last reported are lowered by it."""
        repeated = self._store.holds(tenant_id, lease_id)
        result = self._store.acquire_sync(tenant_id, limits.scaled(self._fraction), lease_id, tokens)
        seen = self._last_seen.get(tenant_id)
        if result.admitted and not repeated and seen is not None:
            spec, requests, token_level, at = seen
            self._last_seen[tenant_id] = (spec, requests - 1, token_level - tokens, at)
        return result

    def release(self, lease: Lease, limits: LimitSpec, used_tokens: int) -> bool:
        return self._store.release_sync(lease, limits.scaled(self._fraction), used_tokens)

    async def renew(self, lease: Lease) -> bool:
        return await self._store.renew(lease)
