"""In-memory quota store: the default for one router, and the fallback while Redis is unreachable."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tenancy.errors import QuotaReason
from tenancy.lease import Backend, Lease
from tenancy.ratelimit_headers import RateLimitState
from tenancy.store import SECONDS_PER_DAY, AcquireResult, LimitSpec, day_of
from tenancy.token_bucket import TokenBucket


@dataclass(slots=True)
class _TenantQuotaState:
    rpm: TokenBucket
    tpm: TokenBucket
    leases: set[str] = field(default_factory=set)
    budget_day: int = 0
    budget_used: int = 0


class MemoryQuotaStore:
    """Quota state in a dict. Not shared between processes. Sync core, async wrappers.

    ``clock`` defaults to ``time.time`` (not monotonic) because the daily budget resets at UTC
    midnight; decisions read only the injected clock.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        concurrency_retry_after: float = 1.0,
        backend: Backend = "memory",
    ) -> None:
        self._clock = clock
        self._concurrency_retry_after = concurrency_retry_after
        self._backend: Backend = backend
        self._tenants: dict[str, _TenantQuotaState] = {}

    @property
    def degraded(self) -> bool:
        return False

    @property
    def degraded_reason(self) -> str | None:
        return None

    def active_leases(self, tenant_id: str) -> int:
        """Concurrency slots held by ``tenant_id`` now."""
        state = self._tenants.get(tenant_id)
        return 0 if state is None else len(state.leases)

    def holds(self, tenant_id: str, lease_id: str) -> bool:
        """Whether ``lease_id`` holds a slot of ``tenant_id`` (an acquire of it again is a retry)."""
        state = self._tenants.get(tenant_id)
        return state is not None and lease_id in state.leases

    def acquire_sync(self, tenant_id: str, limits: LimitSpec, lease_id: str, tokens: int) -> AcquireResult:
        now = self._clock()
        state = self._state(tenant_id, limits, now)
        state.rpm.refill(limits.requests_per_minute, now)
        state.tpm.refill(limits.tokens_per_minute, now)
        day = self._roll_day(state, now)
        if lease_id in state.leases:  # a retry of an admitted request: admitted, charged once
            return AcquireResult(True, None, 0.0, _rate_state(state, limits), day, self._backend)
        reason, retry = self._refusal(state, limits, tokens, now)
        if reason is None:
            state.rpm.level -= 1
            state.tpm.level -= tokens
            state.budget_used += tokens
            state.leases.add(lease_id)
        return AcquireResult(reason is None, reason, retry, _rate_state(state, limits), day, self._backend)

    def release_sync(self, lease: Lease, limits: LimitSpec, used_tokens: int) -> bool:
        state = self._tenants.get(lease.tenant_id)
        if state is None or lease.lease_id not in state.leases:
            return False
        state.leases.discard(lease.lease_id)
        refund = lease.reserved_tokens - used_tokens
        state.tpm.refill(limits.tokens_per_minute, self._clock())
        state.tpm.give_back(refund, limits.tokens_per_minute)
        if state.budget_day == lease.budget_day:
            state.budget_used -= refund
        return True

    async def acquire(self, tenant_id: str, limits: LimitSpec, lease_id: str, tokens: int) -> AcquireResult:
        return self.acquire_sync(tenant_id, limits, lease_id, tokens)

    def seed(self, tenant_id: str, limits: LimitSpec, requests: float, tokens: float, at: float) -> None:
        """Lower a tenant's bucket levels to those given as of `at` (they refill from there); its
        leases stay. A seed never raises a bucket: one that was spent since holds only its refill,
        so seeding again (a store that keeps losing Redis) hands out no share twice."""
        now = max(self._clock(), at)
        state = self._state(tenant_id, limits, at)
        state.rpm = _lower(state.rpm, TokenBucket(requests, at), limits.requests_per_minute, now)
        state.tpm = _lower(state.tpm, TokenBucket(tokens, at), limits.tokens_per_minute, now)

    async def release(self, lease: Lease, limits: LimitSpec, used_tokens: int) -> bool:
        return self.release_sync(lease, limits, used_tokens)

    async def renew(self, lease: Lease) -> bool:
        state = self._tenants.get(lease.tenant_id)
        return state is not None and lease.lease_id in state.leases

    async def close(self) -> None:
        return None

    def _state(self, tenant_id: str, limits: LimitSpec, now: float) -> _TenantQuotaState:
        state = self._tenants.get(tenant_id)
        if state is None:
            state = _TenantQuotaState(
                rpm=TokenBucket.full(limits.requests_per_minute, now),
                tpm=TokenBucket.full(limits.tokens_per_minute, now),
                budget_day=day_of(now),
            )
            self._tenants[tenant_id] = state
        return state

    @staticmethod
    def _roll_day(state: _TenantQuotaState, now: float) -> int:
        day = day_of(now)
        if day != state.budget_day:
            state.budget_day, state.budget_used = day, 0
        return day

    def _refusal(
        self, state: _TenantQuotaState, limits: LimitSpec, tokens: int, now: float
    ) -> tuple[QuotaReason | None, float]:
        if len(state.leases) >= limits.max_concurrent:
            return "concurrency", self._concurrency_retry_after
        if state.rpm.level < 1:
            return "rpm", state.rpm.wait_for(1, limits.requests_per_minute)
        if state.tpm.level < tokens:
            return "tpm", state.tpm.wait_for(tokens, limits.tokens_per_minute)
        budget = limits.daily_token_budget
        if budget is not None and state.budget_used + tokens > budget:
            return "daily_budget", (state.budget_day + 1) * SECONDS_PER_DAY - now
        return None, 0.0


def _rate_state(state: _TenantQuotaState, limits: LimitSpec) -> RateLimitState:
    rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
    return RateLimitState(
        requests_limit=rpm,
        requests_remaining=math.floor(state.rpm.level),
        requests_reset_s=state.rpm.wait_for(rpm, rpm),
        tokens_limit=tpm,
        tokens_remaining=math.floor(state.tpm.level),
        tokens_reset_s=state.tpm.wait_for(tpm, tpm),
    )


def _lower(current: TokenBucket, seeded: TokenBucket, capacity: float, now: float) -> TokenBucket:
    """The lower of two buckets, both refilled to ``now``."""
    seeded.level = min(seeded.level, float(capacity))
    for bucket in (current, seeded):
        bucket.refill(capacity, now)
    return current if current.level <= seeded.level else seeded
