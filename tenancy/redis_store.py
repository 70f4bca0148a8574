"""Redis quota store: quotas, concurrency slots and daily budgets shared by several routers.

Async (``redis.asyncio``) so a round trip never blocks the router's event loop. Every operation
is one atomic Lua script. Keys are ``{prefix}:{<tenant>}:<what>`` (the braces are a Redis Cluster
hash tag, so one tenant's keys share a slot) and all carry TTLs.

If Redis is unreachable or slow (``op_timeout``), the store turns ``degraded``: admission runs on
this router's share of each limit (``local_share``: scaled by ``fallback_fraction``, set it to
``1 / number of routers`` to keep the cluster-wide total near the quota), releases of Redis
leases are queued and replayed later, and every ``retry_interval`` seconds a background probe
tries to reconnect. A call that times out is sent again once (twice ``op_timeout`` in all), more
only while its timeouts fire late because this router's event loop was busy (``redis_calls``).

Buckets and slots run on Redis's ``TIME`` (one clock for every router), and each charge is marked
with its request's lease id, so an acquire or a debit whose reply was lost charges once
(``redis_scripts``). The reconnect probe first drops the client's pooled connections: after a Redis
restart they are all dead, and each would otherwise fail one call and flap the store back into
degraded mode; it also loads the scripts (a restarted Redis has none), and runs once before the
router serves.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

import tenancy.redis_scripts as redis_scripts
from tenancy.lease import Lease
from tenancy.local_share import LocalShare
from tenancy.redis_calls import POOL_CONNECTIONS, call_in_time, open_connections, quota_client
from tenancy.redis_replies import acquire_result
from tenancy.store import SECONDS_PER_DAY, AcquireResult, LimitSpec, day_of

log = logging.getLogger(__name__)

_FAILURES = (RedisError, OSError, asyncio.TimeoutError)
SCRIPTS = (redis_scripts.ACQUIRE, redis_scripts.RELEASE, redis_scripts.RENEW, redis_scripts.DEBIT)
DEBIT_BATCH = 256  # requests per debit script call: keys per call stay few, a call stays short


class RedisQuotaStore:
    """Shared quota state in Redis with a local fallback. One instance per router process.

    ``clock`` is this router's: the local fallback's buckets and the reconnect schedule.
    ``shared_clock`` is the shared state's: None (the default) is Redis's ``TIME``, so routers with
    skewed clocks still agree; tests and simulations pass a clock of their own.
    """

    def __init__(
        self,
        client: Redis,
        prefix: str = "fairlane",
        clock: Callable[[], float] = time.time,
        shared_clock: Callable[[], float] | None = None,
        op_timeout: float = 0.1,
        retry_interval: float = 2.0,
        lease_ttl: float = 900.0,
        fallback_fraction: float = 1.0,
        concurrency_retry_after: float = 1.0,
        max_pending_releases: int = 100_000,
        pool_connections: int = POOL_CONNECTIONS,
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._clock = clock
        self._shared_clock = shared_clock
        self._op_timeout = op_timeout
        self._pool_connections = pool_connections
        self._retry_interval = retry_interval
        self._lease_ttl = lease_ttl
        self._concurrency_retry_after = concurrency_retry_after
        self._local = LocalShare(clock, fallback_fraction, concurrency_retry_after)
        self._acquire = client.register_script(redis_scripts.ACQUIRE)
        self._release = client.register_script(redis_scripts.RELEASE)
        self._renew = client.register_script(redis_scripts.RENEW)
        self._debit = client.register_script(redis_scripts.DEBIT)
        self._degraded_reason: str | None = None
        self._next_probe_at = 0.0
        self._probe_task: asyncio.Task[bool] | None = None
        self._pending: deque[tuple[Lease, LimitSpec, int]] = deque(maxlen=max_pending_releases)

    @classmethod
    def from_url(
        cls, url: str, op_timeout: float = 0.1, pool_connections: int = POOL_CONNECTIONS, **kwargs: Any
    ) -> RedisQuotaStore:
        """A store on a new client (``redis_calls.quota_client``)."""
        client = quota_client(url, op_timeout, pool_connections)
        return cls(client, op_timeout=op_timeout, pool_connections=pool_connections, **kwargs)

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

    def request_mark(self, tenant_id: str, lease_id: str) -> str:
        """The key saying that this request was charged (by an acquire or a debit)."""
        return f"{self._prefix}:{{{tenant_id}}}:req:{lease_id}"

    def _now_arg(self) -> str:
        """The scripts' ``now``: empty for Redis's TIME."""
        return "" if self._shared_clock is None else repr(self._shared_clock())

    def _today(self) -> int:
        """The budget key's day: the shared clock's, or (with Redis's TIME) this router's."""
        return day_of(self._clock() if self._shared_clock is None else self._shared_clock())

    async def acquire(self, tenant_id: str, limits: LimitSpec, lease_id: str, tokens: int) -> AcquireResult:
        if self._use_local():
            return self._local.acquire(tenant_id, limits, lease_id, tokens)
        day = self._today()
        rpm, tpm, conc, budget = self.keys(tenant_id, day)
        args = [
            self._now_arg(),
            limits.requests_per_minute,
            limits.tokens_per_minute,
            tokens,
            limits.max_concurrent,
            lease_id,
            repr(self._lease_ttl),
            -1 if limits.daily_token_budget is None else limits.daily_token_budget,
            2 * SECONDS_PER_DAY,
            math.ceil(self._lease_ttl * 1000),
        ]
        keys = [rpm, tpm, conc, budget, self.request_mark(tenant_id, lease_id)]
        try:
            raw = await self._run(self._acquire, keys, args)
        except _FAILURES as exc:
            # The script may have run (a lost reply). If this router admits the request locally, the
            # debit of that admission finds the request's mark and frees the slot (DEBIT). If it
            # refuses it, the slot would be held by nobody until the lease TTL: release it once
            # Redis is back (a no-op when the script never ran); its tokens come back, the request
            # stays charged.
            self._enter_degraded(exc)
            result = self._local.acquire(tenant_id, limits, lease_id, tokens)
            if not result.admitted:
                phantom = Lease(lease_id, tenant_id, 0, 0, tokens, day, "redis", self._clock())
                self._pending.append((phantom, limits, 0))
            return result
        result = acquire_result(raw, limits, day, self._concurrency_retry_after)
        self._local.saw(tenant_id, limits, float(raw[2]), float(raw[3]))
        return result

    async def release(self, lease: Lease, limits: LimitSpec, used_tokens: int) -> bool:
        """First release of a lease settles it; while degraded, Redis releases are queued (True)."""
        if lease.backend != "redis":
            return self._local.release(lease, limits, used_tokens)
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
        args = [lease.lease_id, self._now_arg(), repr(self._lease_ttl), math.ceil(self._lease_ttl * 1000)]
        try:
            return bool(await self._run(self._renew, [conc], args))
        except _FAILURES as exc:
            self._enter_degraded(exc)
            return True

    async def debit(self, tenant_id: str, limits: LimitSpec, charges: list[tuple[str, int]]) -> bool:
        """Charge admissions made on local limits, ``(lease id, tokens)`` each, to the shared buckets
        and budget, into debt if need be (``redis_scripts.DEBIT``); no slot is taken. A request
        charged already (a lost reply of its acquire or of an earlier try) is not charged again.

        False, and degraded, when Redis did not answer: keep the charges for the next try.
        """
        rpm, tpm, conc, budget = self.keys(tenant_id, self._today())
        cap = -1 if limits.daily_token_budget is None else limits.daily_token_budget
        head = [self._now_arg(), limits.requests_per_minute, limits.tokens_per_minute, cap]
        head += [2 * SECONDS_PER_DAY, math.ceil(2 * self._lease_ttl * 1000)]
        for start in range(0, len(charges), DEBIT_BATCH):
            batch = charges[start : start + DEBIT_BATCH]
            marks = [self.request_mark(tenant_id, lease_id) for lease_id, _ in batch]
            args = head + [x for lease_id, tokens in batch for x in (lease_id, tokens)]
            try:
                await self._run(self._debit, [rpm, tpm, budget, conc, *marks], args)
            except _FAILURES as exc:
                self._enter_degraded(exc)
                return False
        return True

    async def probe(self) -> bool:
        """Try Redis now; on success load the scripts, leave degraded mode and replay queued releases.
        Also the router's warm-up before it serves: a fresh Redis has no scripts either."""
        try:
            async with asyncio.timeout(self._op_timeout):
                await drop_pooled_connections(self._client)
                await self._client.ping()
            await call_in_time(self._load_scripts, self._op_timeout)
            await open_connections(self._client, self._pool_connections)
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

    async def _load_scripts(self) -> None:
        """Send every script ahead of the calls that need it (one round trip). A restarted Redis has
        none, and a call that finds its script missing pays two more round trips inside its deadline
        (NOSCRIPT, then SCRIPT LOAD): on a busy router, enough to time out and degrade the store."""
        pipe = self._client.pipeline(transaction=False)
        for source in SCRIPTS:
            pipe.script_load(source)
        await pipe.execute()

    async def _run(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        """One script call within ``op_timeout``, sent again when the timeout was this router's own
        delay (``redis_calls``: every script here is idempotent)."""
        return await call_in_time(partial(script, keys=keys, args=args), self._op_timeout)

    async def _release_in_redis(self, lease: Lease, limits: LimitSpec, used_tokens: int) -> bool:
        _, tpm, conc, budget = self.keys(lease.tenant_id, lease.budget_day)
        refund = lease.reserved_tokens - used_tokens
        args = [self._now_arg(), limits.tokens_per_minute, lease.lease_id, refund]
        return bool(await self._run(self._release, [tpm, conc, budget], args))

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
        reason = f"redis unreachable: {type(exc).__name__}: {exc}"
        if self._degraded_reason is None:
            log.warning("quota store: %s; local limits in force", reason)
            self._local.seed()
        self._degraded_reason = reason
        self._next_probe_at = self._clock() + self._retry_interval


async def drop_pooled_connections(client: Redis) -> None:
    """Close every pooled connection (each reconnects on its next use). After a failure the others
    are likely dead too (a Redis restart), and each would fail one call of its own."""
    await client.connection_pool.disconnect()
