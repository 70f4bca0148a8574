"""Reconciliation after a Redis outage: charge Redis for what a router admitted on local limits.

``RedisQuotaStore`` (tenancy) falls back to local buckets while Redis is down and replays queued
releases when it returns, but the admissions made locally never reach Redis. If Redis lost its
state (a restart without persistence), every bucket comes back full and a tenant could be served
a second full bucket on top of what it used during the outage. This wrapper sums the local
admissions per tenant and, on the first call after Redis is back, debits them from the shared
buckets (``RedisQuotaStore.debit``: one request per admission and its tokens, no slot). Each
admission is charged by its lease id, so a debit retried after a lost reply, or the local admission
of a request whose Redis acquire ran but timed out, is charged once.

Two orderings matter, because a restarted Redis hands its full bucket to whoever asks first:

* On this router the debits land before any admission of its own reaches Redis: acquires that
  arrive while they are on their way wait for them (one round trip per tenant). They used to go
  straight to Redis, take the fresh bucket, and the debits found it empty and were dropped.
* Another router may reconnect later and debit after this one's admissions: the debit then puts
  the bucket into debt (at most one bucket), paid back by refill, instead of being dropped.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tenancy import Lease, RedisQuotaStore
from tenancy.store import AcquireResult, LimitSpec

log = logging.getLogger(__name__)


class ReconcilingStore:
    """A ``QuotaStore`` over a ``RedisQuotaStore`` that reconciles local admissions on reconnect."""

    def __init__(self, inner: RedisQuotaStore) -> None:
        self._inner = inner
        # (tenant, limits) -> (lease id, tokens) of each admission made locally, not yet debited.
        self._owed: dict[tuple[str, LimitSpec], list[tuple[str, int]]] = {}
        self._reconciling = asyncio.Lock()
        self.reconciled = 0

    def __getattr__(self, name: str) -> Any:  # degraded, degraded_reason, pending_releases, close...
        return getattr(self._inner, name)

    async def acquire(self, tenant_id: str, limits: LimitSpec, lease_id: str, tokens: int) -> AcquireResult:
        await self._reconcile_if_back()
        result = await self._inner.acquire(tenant_id, limits, lease_id, tokens)
        if result.admitted and result.backend != "redis":
            self._owe(tenant_id, limits, [(lease_id, tokens)])
        return result

    async def release(self, lease: Lease, limits: LimitSpec, used_tokens: int) -> bool:
        return await self._inner.release(lease, limits, used_tokens)

    async def renew(self, lease: Lease) -> bool:
        return await self._inner.renew(lease)

    async def probe(self) -> bool:
        ok = await self._inner.probe()
        await self._reconcile_if_back()
        return ok

    def _owe(self, tenant_id: str, limits: LimitSpec, charges: list[tuple[str, int]]) -> None:
        self._owed.setdefault((tenant_id, limits), []).extend(charges)

    async def _reconcile_if_back(self) -> None:
        # No await on the common path (nothing owed, or Redis still down, and no debit on its way).
        if not self._reconciling.locked() and (not self._owed or self._inner.degraded):
            return
        async with self._reconciling:  # callers that arrive meanwhile wait here for the debits
            done = 0
            while self._owed and not self._inner.degraded:
                (tenant_id, limits), charges = self._owed.popitem()
                if not await self._inner.debit(tenant_id, limits, charges):
                    self._owe(tenant_id, limits, charges)  # Redis went again: next time, charged once
                    break
                done += len(charges)
        self.reconciled += done
        if done:
            log.warning("reconciled %d admissions made on local limits during the Redis outage", done)
