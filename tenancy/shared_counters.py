"""Fair-share counters shared by several routers through Redis.

Each router runs its own `FairQueue`; without sharing, a tenant served by router A looks unserved to
router B. `SharedCounters.sync` publishes the counter growth this router charged since the last
sync into one Redis hash (`HINCRBYFLOAT`, in a transaction with the read-back) and credits each
tenant with the growth the other routers added meanwhile. After a sync every router ranks tenants
by their cluster-wide service, up to one sync interval of lag. Lifts of idle tenants stay local:
they only ever raise a counter, so they cannot give a tenant more than its share.

If Redis fails or is slow the charged growth is kept and published on the next successful sync;
nothing waits longer than `op_timeout`. A batch is published at most once: it carries this router's
id and a sequence number, and Redis applies a router's batch only above the last number it applied
(`_PUBLISH`), so a sync retried after a lost reply does not add the same growth twice.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from redis.asyncio import Redis
from redis.exceptions import RedisError

from tenancy.fair_queue import FairQueue
from tenancy.redis_store import drop_pooled_connections

log = logging.getLogger(__name__)
_FAILURES = (RedisError, OSError, asyncio.TimeoutError)

# KEYS: totals, applied (router id -> last sequence number applied)
# ARGV: router id, sequence number, ttl_s, then tenant, growth pairs. Returns the totals (HGETALL).
_PUBLISH = """
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if tonumber(ARGV[2]) > last then
  for i = 4, #ARGV, 2 do redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1]) end
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
redis.call('EXPIRE', KEYS[2], tonumber(ARGV[3]))
return redis.call('HGETALL', KEYS[1])
"""


class SharedCounters:
    def __init__(self, client: Redis, prefix: str = "fairlane", op_timeout: float = 0.1, ttl_s: int = 86400):
        self._client = client
        self._keys = [f"{prefix}:{{vtc}}", f"{prefix}:{{vtc}}:applied"]  # one hash slot
        self._publish = client.register_script(_PUBLISH)
        self._router_id = uuid.uuid4().hex
        self._op_timeout = op_timeout
        self._ttl_s = ttl_s
        self._seen: dict[str, float] = {}  # the hash's totals as of our last sync
        self._unsent: dict[str, float] = {}  # growth charged since the batch in flight was made
        self._batch: dict[str, float] | None = None  # published until Redis confirms it, same number
        self._batch_number = 0
        self.degraded_reason: str | None = None

    @property
    def degraded(self) -> bool:
        return self.degraded_reason is not None

    async def sync(self, queue: FairQueue) -> bool:
        """Share this router's growth and take in the others'. False (and nothing lost) on failure."""
        for tenant, delta in queue.take_local_service().items():
            self._unsent[tenant] = self._unsent.get(tenant, 0.0) + delta
        if self._batch is None:  # the last batch is confirmed: the growth since goes out as the next
            self._batch, self._unsent = self._unsent, {}
            self._batch_number += 1
        mine = self._batch
        try:
            async with asyncio.timeout(self._op_timeout):
                if self.degraded:  # after a failure every pooled connection may be dead (a restart)
                    await drop_pooled_connections(self._client)
                totals = await self._exchange(mine)
        except _FAILURES as exc:  # the batch may have been applied: it is sent again, same number
            if not self.degraded:
                log.warning("fair-share counter sync failed; ranking on local service: %r", exc)
            self.degraded_reason = repr(exc)[:200]
            return False
        self.degraded_reason = None
        self._batch = None
        for tenant, total in totals.items():
            remote = total - self._seen.get(tenant, 0.0) - mine.get(tenant, 0.0)
            queue.credit(tenant, remote)
            self._seen[tenant] = total
        return True

    async def _exchange(self, mine: dict[str, float]) -> dict[str, float]:
        args: list[str | float | int] = [self._router_id, self._batch_number, self._ttl_s]
        for tenant, delta in mine.items():
            args += [tenant, repr(delta)]
        flat = await self._publish(keys=self._keys, args=args)
        return {_text(flat[i]): float(flat[i + 1]) for i in range(0, len(flat), 2)}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
