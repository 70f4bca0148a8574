"""Fair-share counters shared by several routers through Redis.

Each router runs its own `FairQueue`; without sharing, a tenant served by router A looks unserved to
router B. `SharedCounters.sync` publishes the counter growth this router charged since the last
sync into one Redis hash (`HINCRBYFLOAT`, in a transaction with the read-back) and credits each
tenant with the growth the other routers added meanwhile. After a sync every router ranks tenants
by their cluster-wide service, up to one sync interval of lag. With ``share_lifts`` (off by
default: measured, not better on every trace) lifts of returning tenants travel too, as per-tenant
offsets that Redis keeps by maximum (``tenancy/shared_lifts.py``).

If Redis fails or is slow the charged growth is kept and published on the next successful sync;
nothing waits longer than `op_timeout`. A batch is published at most once: it carries this router's
id and a sequence number, and Redis applies a router's batch only above the last number it applied
(`_PUBLISH`), so a sync retried after a lost reply does not add the same growth twice. The
batches and credits are ``tenancy/counter_sync.py``'s, which the simulator runs in memory.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from redis.asyncio import Redis
from redis.exceptions import RedisError

from tenancy.counter_sync import CounterBatches
from tenancy.fair_queue import FairQueue
from tenancy.redis_store import drop_pooled_connections

log = logging.getLogger(__name__)
_FAILURES = (RedisError, OSError, asyncio.TimeoutError)

# KEYS: totals, applied (router id -> last sequence number applied), offsets (tenant -> lift offset)
# ARGV: router id, sequence number, ttl_s, n, then n tenant, growth pairs, then tenant, offset pairs.
# Growth is added once per sequence number; an offset is kept if higher. Returns totals and offsets.
_PUBLISH = """
local growth_end = 4 + 2 * tonumber(ARGV[4])
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if tonumber(ARGV[2]) > last then
  for i = 5, growth_end, 2 do redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1]) end
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
end
for i = growth_end + 1, #ARGV, 2 do
  local had = tonumber(redis.call('HGET', KEYS[3], ARGV[i]))
  if had == nil or tonumber(ARGV[i + 1]) > had then redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
end
for i = 1, 3 do redis.call('EXPIRE', KEYS[i], tonumber(ARGV[3])) end
return {redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[3])}
"""


class SharedCounters:
    def __init__(
        self,
        client: Redis,
        prefix: str = "fairlane",
        op_timeout: float = 0.1,
        ttl_s: int = 86400,
        share_lifts: bool = False,
    ):
        self._client = client
        parts = ("", ":applied", ":offsets")
        self._keys = [f"{prefix}:{{vtc}}{part}" for part in parts]  # one hash slot
        self._publish = client.register_script(_PUBLISH)
        self._router_id = uuid.uuid4().hex
        self._op_timeout = op_timeout
        self._ttl_s = ttl_s
        self._batches = CounterBatches(share_lifts)  # the pure part, shared with the simulator
        self.degraded_reason: str | None = None

    @property
    def degraded(self) -> bool:
        return self.degraded_reason is not None

    async def sync(self, queue: FairQueue) -> bool:
        """Share this router's growth and take in the others'. False (and nothing lost) on failure."""
        mine = self._batches.next_batch(queue)
        try:
            async with asyncio.timeout(self._op_timeout):
                if self.degraded:  # after a failure every pooled connection may be dead (a restart)
                    await drop_pooled_connections(self._client)
                totals, offsets = await self._exchange(mine)
        except _FAILURES as exc:  # the batch may have been applied: it is sent again, same number
            if not self.degraded:
                log.warning("fair-share counter sync failed; ranking on local service: %r", exc)
            self.degraded_reason = repr(exc)[:200]
            return False
        self.degraded_reason = None
        self._batches.confirmed(queue, totals, offsets)
        return True

    async def _exchange(self, mine: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
        """Publish the batch and the lifts; the cluster's totals and lift offsets."""
        args: list[str | float | int] = [self._router_id, self._batches.number, self._ttl_s, len(mine)]
        for tenant, value in (*mine.items(), *self._batches.lifted.items()):
            args += [tenant, repr(value)]
        flat_totals, flat_offsets = await self._publish(keys=self._keys, args=args)
        return _floats(flat_totals), _floats(flat_offsets)


def _floats(flat: list) -> dict[str, float]:
    return {_text(flat[i]): float(flat[i + 1]) for i in range(0, len(flat), 2)}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
