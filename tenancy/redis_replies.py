"""What the quota store's ``ACQUIRE`` script answers, as an ``AcquireResult``.

The reply is ``{reason, retry, rpm level, tpm level, active, used, now, repeated}``
(``redis_scripts.ACQUIRE``); floats come as strings (Redis would truncate Lua numbers to integers),
and ``now`` is the script's clock (Redis's ``TIME`` unless the caller passed its own ``now``).
"""

from __future__ import annotations

import math
from typing import Any

from tenancy.ratelimit_headers import RateLimitState
from tenancy.store import SECONDS_PER_DAY, AcquireResult, LimitSpec


def acquire_result(
    raw: list[Any], limits: LimitSpec, day: int, concurrency_retry_after: float
) -> AcquireResult:
    """The admission (or refusal, with its retry-after) and the rate-limit state an ``ACQUIRE``
    reply says, for the budget of ``day``."""
    reason = _text(raw[0]) or None
    now = float(raw[6])
    retry = float(raw[1])
    if reason == "concurrency":
        retry = concurrency_retry_after
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
