"""The quota-store contract shared by the memory and Redis stores.

Both stores expose the same **async** interface (the router is asyncio-based and a Redis round
trip must not block its event loop). The memory store also offers the same operations as plain
sync methods (``*_sync``) so a discrete-event simulator can drive it without an event loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tenancy.config import Quotas
from tenancy.errors import QuotaReason
from tenancy.lease import Backend, Lease
from tenancy.ratelimit_headers import RateLimitState

SECONDS_PER_DAY = 86_400


def day_of(now: float) -> int:
    """Index of the (UTC, for a wall clock) day containing ``now``."""
    return int(now // SECONDS_PER_DAY)


@dataclass(frozen=True, slots=True)
class LimitSpec:
    """The quota numbers a store enforces for one tenant."""

    requests_per_minute: int
    tokens_per_minute: int
    max_concurrent: int
    daily_token_budget: int | None = None

    @classmethod
    def from_quotas(cls, quotas: Quotas) -> LimitSpec:
        return cls(
            quotas.requests_per_minute,
            quotas.tokens_per_minute,
            quotas.max_concurrent_requests,
            quotas.daily_token_budget,
        )

    def scaled(self, fraction: float) -> LimitSpec:
        """This spec times ``fraction`` (rounded up, at least 1): one router's share while degraded."""
        budget = self.daily_token_budget
        return LimitSpec(
            max(1, math.ceil(self.requests_per_minute * fraction)),
            max(1, math.ceil(self.tokens_per_minute * fraction)),
            max(1, math.ceil(self.max_concurrent * fraction)),
            None if budget is None else max(1, math.ceil(budget * fraction)),
        )


@dataclass(frozen=True, slots=True)
class AcquireResult:
    """Outcome of one atomic admission attempt."""

    admitted: bool
    reason: QuotaReason | None
    retry_after: float
    state: RateLimitState
    budget_day: int
    backend: Backend


@runtime_checkable
class QuotaStore(Protocol):
    """Atomic quota state: token buckets, concurrency slots, daily budgets."""

    @property
    def degraded(self) -> bool: ...

    @property
    def degraded_reason(self) -> str | None: ...

    async def acquire(self, tenant_id: str, limits: LimitSpec, lease_id: str, tokens: int) -> AcquireResult:
        """Take 1 request, ``tokens`` tokens, one concurrency slot and budget, all or nothing."""
        ...

    async def release(self, lease: Lease, limits: LimitSpec, used_tokens: int) -> bool:
        """Free the slot and settle reserved vs. used tokens; True only for the first call per lease."""
        ...

    async def renew(self, lease: Lease) -> bool:
        """Extend the slot's time-to-live (Redis); False when the slot is gone."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class SyncQuotaStore(QuotaStore, Protocol):
    """A store whose operations can also run without an event loop (the memory store)."""

    def acquire_sync(
        self, tenant_id: str, limits: LimitSpec, lease_id: str, tokens: int
    ) -> AcquireResult: ...

    def release_sync(self, lease: Lease, limits: LimitSpec, used_tokens: int) -> bool: ...
