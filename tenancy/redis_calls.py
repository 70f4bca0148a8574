"""How the quota store talks to Redis: its client and pool, and calls with a deadline that tells
Redis's slowness from this process's own.

The pool is opened ahead and bounded. A burst of admissions waits for a pooled connection (within its
deadline) instead of opening its own: 40 connections opened at once took 44-91 ms of a 100-ms
deadline on a busy 2-core box and timed the store out at a router's first burst (6-9 ms with the
connections open ahead; 7-56 ms, 5 of 6 runs at most 15, on the bounded pool the probe opens).
The probe opens the whole pool, off every request's path (after a restart every connection is dead).

``asyncio.timeout`` fires when the event loop next runs its timers. On a busy router (its loop held
by other work for longer than the deadline) the reply may have arrived in time and still lose to the
timer: the call "times out" though Redis answered, and the quota store would degrade to local limits
for a delay that was the router's. Under load that flapped the store in and out of degraded mode,
and each flap handed out local shares that a later Redis restart forgave (tests/faults, the outage
drill). So a timed-out call is sent again once, and again while its timeouts fire late (by at least
half the deadline: this process's delay, not Redis's); two slow round trips running degrade the
store. A stalled Redis costs the first request twice the deadline; a refused connection none. Only
idempotent calls go through here (every quota script is: a request's mark, a lease's slot), so a
call that ran twice charges once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeout

T = TypeVar("T")
LATE_FRACTION = 0.5  # a timeout this much of the deadline late was the loop's delay
ON_TIME_TRIES = 2  # a timeout that fired on time: once more (two slow round trips running: degrade)
MAX_TRIES = 3  # a loop that late three times running is too slow to wait on
POOL_CONNECTIONS = 16  # per router: ~0.2 ms a call, so tens of thousands of calls a second
OPEN_CONNECTIONS_S = 2.0  # the probe's time to open the pool


def quota_client(url: str, op_timeout: float, pool_connections: int = POOL_CONNECTIONS) -> Redis:
    """A client with short socket timeouts, no client-side retries (the store decides), and a bounded
    pool that callers wait on (their own deadline bounds the wait)."""
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=pool_connections,
        timeout=None,
        socket_timeout=op_timeout,
        socket_connect_timeout=op_timeout,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )
    return Redis.from_pool(pool)


async def open_connections(client: Redis, count: int) -> None:
    """Connect ``count`` pooled connections now. Best effort: what does not open opens on first use."""
    with contextlib.suppress(RedisError, OSError, TimeoutError):
        async with asyncio.timeout(OPEN_CONNECTIONS_S):
            await asyncio.gather(*(client.ping() for _ in range(count)))


async def call_in_time(call: Callable[[], Awaitable[T]], deadline_s: float, tries: int = MAX_TRIES) -> T:
    """``await call()`` within ``deadline_s``. A timeout is sent again once; after that only while
    the timeouts fire late (up to ``tries`` in all). Raises the last timeout otherwise, and anything
    else the call raises at once (a refused connection is an outage, not a slow reply)."""
    loop = asyncio.get_running_loop()
    for attempt in range(1, tries + 1):
        started = loop.time()
        try:
            async with asyncio.timeout(deadline_s):
                return await call()
        except (TimeoutError, RedisTimeout):
            late = loop.time() - started - deadline_s
            if attempt == tries or (attempt >= ON_TIME_TRIES and late < LATE_FRACTION * deadline_s):
                raise
    raise AssertionError("unreachable: the last try returns or raises")
