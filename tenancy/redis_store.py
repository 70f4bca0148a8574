"""Redis quota store: quotas, concurrency slots and daily budgets shared by several routers.

Async (``redis.asyncio``) so a round trip never blocks the router's event loop. Every operation
is one atomic Lua script. Keys are ``{prefix}:{<tenant>}:<what>`` (the braces are a Redis Cluster
hash tag, so one tenant's keys share a slot) and all carry TTLs.

If Redis is unreachable or slow (``op_timeout``), the store turns ``degraded``: admission runs on
a local ``MemoryQuotaStore`` with each limit scaled by ``fallback_fraction`` (set it to
``1 / number of routers`` to keep the cluster-wide total near the quota), releases of Redis
leases are queued and replayed later, and every ``retry_interval`` seconds a background probe
tries to reconnect. No call waits on Redis longer than ``op_timeout``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from tenancy import redis_scripts
from tenancy.lease import Lease
from tenancy.memory_store import MemoryQuotaStore
from tenancy.ratelimit_headers import RateLimitState
from tenancy.store import SECONDS_PER_DAY, AcquireResult, LimitSpec, day_of

log = logging.getLogger(__name__)

_FAILURES = (RedisError, OSError, asyncio.TimeoutError)


class RedisQuotaStore:
    """Shared quota state in Redis with a local fallback. One instance per router process.

    ``clock`` defaults to ``time.time``: the routers sharing the state must agree on time (NTP
    skew only shifts refills by the skew; a clock stepping back refills nothing).
    """

    def __init__(
        self,
        client: Redis,
        prefix: str = "fairlane",
        clock: Callable[[], float] = time.time,
        op_timeout: float = 0.1,
        retry_interval: float = 2.0,
        lease_ttl: float = 900.0,
        fallback_fraction: float = 1.0,
        concurrency_retry_after: float = 1.0,
        max_pending_releases: int = 100_000,
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._clock = clock
        self._op_timeout = op_timeout
        self._retry_interval = retry_interval
        self._lease_ttl = lease_ttl
        self._fraction = fallback_fraction
        self._concurrency_retry_after = concurrency_retry_after
        self._local = MemoryQuotaStore(clock, concurrency_retry_after, backend="local")
        # tenant -> (limits, requests level, tokens level, when): Redis's buckets at its last answer
        self._last_seen: dict[str, tuple[LimitSpec, float, float, float]] = {}
        self._acquire = client.register_script(redis_scripts.ACQUIRE)
        self._release = client.register_script(redis_scripts.RELEASE)
        self._renew = client.register_script(redis_scripts.RENEW)
        self._debit = client.register_script(redis_scripts.DEBIT)
        self._degraded_reason: str | None = None
        self._next_probe_at = 0.0
        self._probe_task: asyncio.Task[bool] | None = None
        self._pending: deque[tuple[Lease, LimitSpec, int]] = deque(maxlen=max_pending_releases)

    @classmethod
    def from_url(cls, url: str, op_timeout: float = 0.1, **kwargs: Any) -> RedisQuotaStore:
        """A store on a new client with short socket timeouts and no client-side retries."""
        client = Redis.from_url(
            url,
            socket_timeout=op_timeout,
            socket_connect_timeout=op_timeout,
            retry=Retry(NoBackoff(), 0),
            decode_responses=True,
        )
        return cls(client, op_timeout=op_timeout, **kwargs)

    @property
    def degraded(self) -> bool:
        return self._degraded_reason is not None

    @property
    def degraded_reason(self) -> str | None:
        return self._degraded_reason

    @property
    def pending_releases(self) -> int:
        """Releases of Redis leases waiting for Redis to come back."""
        return len(self._pending)

    def keys(self, tenant_id: str, day: int) -> tuple[str, str, str, str]:
        """The rpm, tpm, concurrency and budget keys of a tenant."""
        base = f"{self._prefix}:{{{tenant_id}}}"
        return f"{base}:rpm", f"{base}:tpm", f"{base}:conc", f"{base}:budget:{day}"

    async def acquire(self, tenant_id: str, limits: LimitSpec, lease_id: str, tokens: int) -> AcquireResult:
        if self._use_local():
            return self._local.acquire_sync(tenant_id, limits.scaled(self._fraction), lease_id, tokens)
        now = self._clock()
        day = day_of(now)
        rpm, tpm, conc, budget = self.keys(tenant_id, day)
        args = [
            repr(now),
            limits.requests_per_minute,
            limits.tokens_per_minute,
            tokens,
            limits.max_concurrent,
            lease_id,
            repr(now + self._lease_ttl),
            -1 if limits.daily_token_budget is None else limits.daily_token_budget,
            2 * SECONDS_PER_DAY,
            math.ceil(self._lease_ttl * 1000),
        ]
        try:
            async with asyncio.timeout(self._op_timeout):
                raw = await self._acquire(keys=[rpm, tpm, conc, budget], args=args)
        except _FAILURES as exc:
            self._enter_degraded(exc)
            return self._local.acquire_sync(tenant_id, limits.scaled(self._fraction), lease_id, tokens)
        result = self._result(raw, limits, now, day)
        self._last_seen[tenant_id] = (limits, float(raw[2]), float(raw[3]), now)
        return result

    async def release(self, lease: Lease, limits: LimitSpec, used_tokens: int) -> bool:
        """First release of a lease settles it; while degraded, Redis releases are queued (True)."""
        if lease.backend != "redis":
            return self._local.release_sync(lease, limits.scaled(self._fraction), used_tokens)
        if self.degraded:
            self._pending.append((lease, limits, used_tokens))
            self._use_local()
            return True
        try:
            return await self._release_in_redis(lease, limits, used_tokens)
        except _FAILURES as exc:
            self._enter_degraded(exc)
            self._pending.append((lease, limits, used_tokens))
            return True

    async def renew(self, lease: Lease) -> bool:
        if lease.backend != "redis":
            return await self._local.renew(lease)
        if self.degraded:
            return True
        conc = self.keys(lease.tenant_id, lease.budget_day)[2]
        args = [lease.lease_id, repr(self._clock() + self._lease_ttl), math.ceil(self._lease_ttl * 1000)]
        try:
            async with asyncio.timeout(self._op_timeout):
                return bool(await self._renew(keys=[conc], args=args))
        except _FAILURES as exc:
            self._enter_degraded(exc)
            return True

    async def debit(self, tenant_id: str, limits: LimitSpec, requests: int, tokens: int) -> bool:
        """Charge ``requests`` admissions and their ``tokens`` made on local limits to the shared
        buckets and budget, into debt if need be (``redis_scripts.DEBIT``); no slot is taken.

        False, and degraded, when Redis did not answer: keep the charge for the next try.
        """
        now = self._clock()
        rpm, tpm, _, budget = self.keys(tenant_id, day_of(now))
        cap = -1 if limits.daily_token_budget is None else limits.daily_token_budget
        args = [repr(now), limits.requests_per_minute, limits.tokens_per_minute, requests, tokens, cap]
        try:
            async with asyncio.timeout(self._op_timeout):
                await self._debit(keys=[rpm, tpm, budget], args=[*args, 2 * SECONDS_PER_DAY])
        except _FAILURES as exc:
            self._enter_degraded(exc)
            return False
        return True

    async def probe(self) -> bool:
        """Try Redis now; on success leave degraded mode and replay queued releases."""
        try:
            async with asyncio.timeout(self._op_timeout):
                await self._client.ping()
            while self._pending:
                lease, limits, used = self._pending[0]
                await self._release_in_redis(lease, limits, used)
                self._pending.popleft()
        except _FAILURES as exc:
            self._next_probe_at = self._clock() + self._retry_interval
            self._degraded_reason = f"redis unreachable: {type(exc).__name__}: {exc}"
            return False
        if self._degraded_reason is not None:
            log.warning("quota store: Redis is back; shared quotas restored")
        self._degraded_reason = None
        return True

    async def close(self) -> None:
        if self._probe_task is not None:
            self._probe_task.cancel()
        await self._client.aclose()

    # -- internals -------------------------------------------------------------------------------

    async def _release_in_redis(self, lease: Lease, limits: LimitSpec, used_tokens: int) -> bool:
        _, tpm, conc, budget = self.keys(lease.tenant_id, lease.budget_day)
        refund = lease.reserved_tokens - used_tokens
        args = [repr(self._clock()), limits.tokens_per_minute, lease.lease_id, refund]
        async with asyncio.timeout(self._op_timeout):
            return bool(await self._release(keys=[tpm, conc, budget], args=args))

    def _use_local(self) -> bool:
        """Whether to serve locally now; starts a background reconnect probe when one is due."""
        if not self.degraded:
            return False
        probing = self._probe_task is not None and not self._probe_task.done()
        if not probing and self._clock() >= self._next_probe_at:
            self._next_probe_at = self._clock() + self._retry_interval
            self._probe_task = asyncio.get_running_loop().create_task(self.probe())
        return True

    def _enter_degraded(self, exc: BaseException) -> None:
        if self._degraded_reason is None:
            log.warning("quota store: Redis unreachable (%s); local limits in force", type(exc).__name__)
            self._seed_local()
        self._degraded_reason = f"redis unreachable: {type(exc).__name__}: {exc}"
        self._next_probe_at = self._clock() + self._retry_interval

    def _seed_local(self) -> None:
        """Local buckets start from this router's share of the levels Redis last reported, not full:
        a tenant at its quota when Redis went away gets no fresh burst, only the local refill."""
        for tenant_id, (limits, requests, tokens, at) in self._last_seen.items():
            f = self._fraction
            self._local.seed(tenant_id, limits.scaled(f), f * requests, f * tokens, at)

    def _result(self, raw: list[Any], limits: LimitSpec, now: float, day: int) -> AcquireResult:
        reason = _text(raw[0]) or None
        retry = float(raw[1])
        if reason == "concurrency":
            retry = self._concurrency_retry_after
        elif reason == "daily_budget":
            retry = (day + 1) * SECONDS_PER_DAY - now
        rl, tl = float(raw[2]), float(raw[3])
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        state = RateLimitState(
            rpm, math.floor(rl), (rpm - rl) * 60.0 / rpm, tpm, math.floor(tl), (tpm - tl) * 60.0 / tpm
        )
        return AcquireResult(reason is None, reason, retry, state, day, "redis")  # type: ignore[arg-type]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
