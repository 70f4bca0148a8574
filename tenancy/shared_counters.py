"""Fair-share counters shared by several routers through Redis.

Each router runs its own `FairQueue`; without sharing, a tenant served by router A looks unserved to
router B. `SharedCounters.sync` publishes the counter growth this router charged since the last
sync into one Redis hash (`HINCRBYFLOAT`, in a transaction with the read-back) and credits each
tenant with the growth the other routers added meanwhile. After a sync every router ranks tenants
by their cluster-wide service, up to one sync interval of lag. Lifts of idle tenants stay local:
they only ever raise a counter, so they cannot give a tenant more than its share.

If Redis fails or is slow the charged growth is kept and published on the next successful sync;
nothing waits longer than `op_timeout`.
"""

from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis
from redis.exceptions import RedisError

from tenancy.fair_queue import FairQueue

log = logging.getLogger(__name__)
_FAILURES = (RedisError, OSError, asyncio.TimeoutError)


class SharedCounters:
    def __init__(self, client: Redis, prefix: str = "fairlane", op_timeout: float = 0.1, ttl_s: int = 86400):
        self._client = client
        self._key = f"{prefix}:vtc"
        self._op_timeout = op_timeout
        self._ttl_s = ttl_s
        self._seen: dict[str, float] = {}  # the hash's totals as of our last sync
        self._unsent: dict[str, float] = {}
        self.degraded_reason: str | None = None

    @property
    def degraded(self) -> bool:
        return self.degraded_reason is not None

    def reset(self) -> None:
        """Forget the totals seen, so the next sync credits a fresh queue with the whole history."""
        self._seen.clear()

    async def sync(self, queue: FairQueue) -> bool:
        """Share this router's growth and take in the others'. False (and nothing lost) on failure."""
        for tenant, delta in queue.take_local_service().items():
            self._unsent[tenant] = self._unsent.get(tenant, 0.0) + delta
        mine, self._unsent = self._unsent, {}
        try:
            async with asyncio.timeout(self._op_timeout):
                totals = await self._exchange(mine)
        except _FAILURES as exc:
            for tenant, delta in mine.items():  # keep it for the next sync
                self._unsent[tenant] = self._unsent.get(tenant, 0.0) + delta
            if not self.degraded:
                log.warning("fair-share counter sync failed; ranking on local service: %r", exc)
            self.degraded_reason = repr(exc)[:200]
            return False
        self.degraded_reason = None
        for tenant, total in totals.items():
            remote = total - self._seen.get(tenant, 0.0) - mine.get(tenant, 0.0)
            queue.credit(tenant, remote)
            self._seen[tenant] = total
        return True

    async def _exchange(self, mine: dict[str, float]) -> dict[str, float]:
        async with self._client.pipeline(transaction=True) as pipe:
            for tenant, delta in mine.items():
                pipe.hincrbyfloat(self._key, tenant, delta)
            pipe.expire(self._key, self._ttl_s)
            pipe.hgetall(self._key)
            results = await pipe.execute()
        return {_text(k): float(v) for k, v in results[-1].items()}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
