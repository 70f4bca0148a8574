"""Admission control: per-request limits, then an atomic quota acquisition that yields a Lease.

TPM and the daily budget are charged at admission with the worst case, ``prompt_tokens +
max_tokens``, so concurrent requests can never overshoot the budget; at the end ``release``
refunds ``max_tokens - output_tokens`` (or charges the excess, should a request ever produce
more). RPM is never refunded: the request was made.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from tenancy.config import TenancyConfig, Tenant
from tenancy.errors import QuotaExceeded, RequestLimitExceeded
from tenancy.lease import Lease
from tenancy.memory_store import MemoryQuotaStore
from tenancy.ratelimit_headers import ratelimit_headers
from tenancy.store import AcquireResult, LimitSpec, QuotaStore, SyncQuotaStore


class QuotaManager:
    """Admits requests against their tenant's quotas; one instance per router process."""

    def __init__(
        self,
        config: TenancyConfig,
        store: QuotaStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._store: QuotaStore = store if store is not None else MemoryQuotaStore(clock=clock)
        self._clock = clock
        self._limits = {t.id: LimitSpec.from_quotas(t.quotas) for t in config.tenants}

    @property
    def store(self) -> QuotaStore:
        return self._store

    @property
    def degraded(self) -> bool:
        """True while the shared store is unreachable and local limits apply."""
        return self._store.degraded

    def check_request(self, tenant: Tenant, prompt_tokens: int, max_tokens: int, choices: int = 1) -> int:
        """Per-request limits; returns the tokens to reserve or raises ``RequestLimitExceeded``.

        ``max_tokens`` is the whole request's output budget, ``choices`` × each choice's. A choice is one
        answer: the answer's limits (max_tokens_per_request, max_context_length) apply to each, as
        OpenAI's do to each of ``n``; the budgets (tokens per minute, per day) to the whole reservation.
        """
        q = tenant.quotas
        if prompt_tokens < 0 or max_tokens < 0:
            raise RequestLimitExceeded(tenant.id, "non_negative_tokens", min(prompt_tokens, max_tokens), 0)
        per_choice = -(-max_tokens // max(1, choices))
        if per_choice > q.max_tokens_per_request:
            limit = q.max_tokens_per_request
            raise RequestLimitExceeded(tenant.id, "max_tokens_per_request", per_choice, limit)
        if prompt_tokens + per_choice > q.max_context_length:
            total = prompt_tokens + per_choice
            raise RequestLimitExceeded(tenant.id, "max_context_length", total, q.max_context_length)
        total = prompt_tokens + max_tokens
        if total > q.tokens_per_minute:
            raise RequestLimitExceeded(tenant.id, "tokens_per_minute", total, q.tokens_per_minute)
        if q.daily_token_budget is not None and total > q.daily_token_budget:
            raise RequestLimitExceeded(tenant.id, "daily_token_budget", total, q.daily_token_budget)
        return total

    async def admit(
        self,
        tenant: Tenant | str,
        prompt_tokens: int,
        max_tokens: int,
        request_id: str | None = None,
        choices: int = 1,
    ) -> Lease:
        """Admit one request or raise ``RequestLimitExceeded`` / ``QuotaExceeded``.

        ``request_id`` (server-made, never a client's) becomes the lease id: a shared store charges
        one request once however often its calls are retried. None: a fresh id. ``max_tokens``: the
        output budget of all ``choices`` together (``check_request``).
        """
        tenant = self._tenant(tenant)
        tokens = self.check_request(tenant, prompt_tokens, max_tokens, choices)
        lease_id = request_id or uuid.uuid4().hex
        result = await self._store.acquire(tenant.id, self._limits[tenant.id], lease_id, tokens)
        return self._lease_or_raise(tenant, result, lease_id, prompt_tokens, max_tokens)

    async def release(self, lease: Lease, output_tokens: int) -> bool:
        """End the request (completion, error, abort or disconnect). Idempotent: True the first time."""
        if lease.released:
            return False
        lease.released = True
        used = lease.prompt_tokens + max(0, output_tokens)
        return await self._store.release(lease, self._limits[lease.tenant_id], used)

    async def renew(self, lease: Lease) -> bool:
        """Keep a long request's concurrency slot alive in a shared store (call every few minutes)."""
        return not lease.released and await self._store.renew(lease)

    def admit_sync(self, tenant: Tenant | str, prompt_tokens: int, max_tokens: int) -> Lease:
        """``admit`` without an event loop; needs a store with a sync API (the memory store)."""
        store = self._sync_store()
        tenant = self._tenant(tenant)
        tokens = self.check_request(tenant, prompt_tokens, max_tokens)
        lease_id = uuid.uuid4().hex
        result = store.acquire_sync(tenant.id, self._limits[tenant.id], lease_id, tokens)
        return self._lease_or_raise(tenant, result, lease_id, prompt_tokens, max_tokens)

    def release_sync(self, lease: Lease, output_tokens: int) -> bool:
        """``release`` without an event loop; needs a store with a sync API (the memory store)."""
        store = self._sync_store()
        if lease.released:
            return False
        lease.released = True
        used = lease.prompt_tokens + max(0, output_tokens)
        return store.release_sync(lease, self._limits[lease.tenant_id], used)

    def _tenant(self, tenant: Tenant | str) -> Tenant:
        return self._config.tenant(tenant) if isinstance(tenant, str) else tenant

    def _sync_store(self) -> SyncQuotaStore:
        if not isinstance(self._store, SyncQuotaStore):
            raise TypeError(f"{type(self._store).__name__} has no sync API; use the async methods")
        return self._store

    def _lease_or_raise(
        self, tenant: Tenant, result: AcquireResult, lease_id: str, prompt_tokens: int, max_tokens: int
    ) -> Lease:
        if not result.admitted:
            headers = ratelimit_headers(result.state, result.retry_after)
            raise QuotaExceeded(tenant.id, result.reason or "rpm", result.retry_after, headers)
        return Lease(
            lease_id=lease_id,
            tenant_id=tenant.id,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            reserved_tokens=prompt_tokens + max_tokens,
            budget_day=result.budget_day,
            backend=result.backend,
            acquired_at=self._clock(),
            headers=ratelimit_headers(result.state),
        )
