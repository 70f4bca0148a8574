"""Reconciliation after a Redis outage: charge Redis for what a router admitted on local limits.

``RedisQuotaStore`` (tenancy) falls back to local buckets while Redis is down and replays queued
releases when it returns, but the admissions made locally never reach Redis. If Redis lost its
state (a restart without persistence), every bucket comes back full and a tenant could be served
a second full bucket on top of what it used during the outage. This wrapper remembers the local
admissions (bounded) and, on the first call after Redis is back, debits them from the shared
buckets (an acquire immediately released with all tokens used: one request, its tokens, no slot
kept). A debit that finds the bucket empty is dropped: the bucket is already as low as it goes.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from typing import Any

from tenancy import Lease, RedisQuotaStore
from tenancy.store import AcquireResult, LimitSpec

log = logging.getLogger(__name__)
MAX_REMEMBERED = 100_000


class ReconcilingStore:
    """A ``QuotaStore`` over a ``RedisQuotaStore`` that reconciles local admissions on reconnect."""

    def __init__(self, inner: RedisQuotaStore) -> None:
        self._inner = inner
        self._local: deque[tuple[str, LimitSpec, int]] = deque(maxlen=MAX_REMEMBERED)
        self._was_degraded = False
        self.reconciled = 0

    def __getattr__(self, name: str) -> Any:  # degraded, degraded_reason, pending_releases, close...
        return getattr(self._inner, name)

    async def acquire(self, tenant_id: str, limits: LimitSpec, lease_id: str, tokens: int) -> AcquireResult:
        await self._reconcile_if_back()
        result = await self._inner.acquire(tenant_id, limits, lease_id, tokens)
        if result.admitted and result.backend != "redis":
            self._local.append((tenant_id, limits, tokens))
        self._was_degraded = self._inner.degraded or self._was_degraded
        return result

    async def release(self, lease: Lease, limits: LimitSpec, used_tokens: int) -> bool:
        return await self._inner.release(lease, limits, used_tokens)

    async def renew(self, lease: Lease) -> bool:
        return await self._inner.renew(lease)

    async def probe(self) -> bool:
        ok = await self._inner.probe()
        await self._reconcile_if_back()
        return ok

    async def _reconcile_if_back(self) -> None:
        if not self._was_degraded or self._inner.degraded:
            return
        self._was_degraded = False
        done = 0
        while self._local and not self._inner.degraded:
            tenant_id, limits, tokens = self._local.popleft()
            # One request and its tokens; the slot it takes is given back at once.
            lease_id = uuid.uuid4().hex
            result = await self._inner.acquire(tenant_id, limits, lease_id, tokens)
            if result.admitted and result.backend == "redis":
                lease = Lease(
                    lease_id=lease_id,
                    tenant_id=tenant_id,
                    prompt_tokens=tokens,
                    max_tokens=0,
                    reserved_tokens=tokens,
                    budget_day=result.budget_day,
                    backend="redis",
                    acquired_at=0.0,
                )
                await self._inner.release(lease, limits, tokens)
            done += 1
        self.reconciled += done
        if done:
            log.warning("reconciled %d admissions made on local limits during the Redis outage", done)
