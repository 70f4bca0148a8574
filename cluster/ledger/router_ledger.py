"""One router's ledger: the sink its timing records go to, its writer, retention and reports.

The database is PostgreSQL when a DSN is configured (``ledger_dsn``, or ``FAIRLANE_LEDGER_DSN``,
the chart's Secret), else the SQLite file ``ledger_path``, which every router on the machine shares.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from prometheus_client import CollectorRegistry

from cluster.config import AppConfig
from cluster.ledger import metrics
from cluster.ledger.rollup_job import delete_rollup_before, roll_pending
from cluster.ledger.rows import Pricing, row_from_timing
from cluster.ledger.spill import SpillLog
from cluster.ledger.store import LedgerStore
from cluster.ledger.writer import LedgerWriter, WriterSettings
from cluster.telemetry.request_timing import RequestTiming
from tenancy import TenancyConfig, Tenant, default_tenancy_config
from tenancy.loader import load_tenancy_config

log = logging.getLogger(__name__)
DSN_ENV = "FAIRLANE_LEDGER_DSN"
T = TypeVar("T")
RETENTION_EVERY_S = 3600.0
ROLLUP_EVERY_S = 60.0
ROLLUP_STEP_HOURS = 24  # hours rolled per round; a backlog (a first start on old rows) takes rounds


def ledger_dsn(config: AppConfig) -> str:
    """The configured DSN, else the environment's, else the SQLite file."""
    return config.ledger_dsn or os.environ.get(DSN_ENV) or str(Path(config.ledger_path).expanduser())


class RouterLedger:
    """Rows of this router's finished requests on their way to the ledger, and what it reports."""

    def __init__(
        self,
        config: AppConfig,
        app: str,
        router: str,
        pricing: Callable[[str], Pricing],
        registry: CollectorRegistry | None = None,
        settings: WriterSettings | None = None,
        tenancy: Callable[[], TenancyConfig] | None = None,
    ) -> None:
        """``pricing``: a model's price and room now (the tenancy can be reloaded); ``tenancy``: the
        SLA targets now, for the rollup's met counts (default: the app's tenancy file)."""
        self.app = app
        self.router = router
        self._pricing = pricing
        self.store = LedgerStore(ledger_dsn(config))
        spill = SpillLog(Path(config.ledger_spill_dir), f"{app}-{router}", config.ledger_spill_max_rows)
        self.writer = LedgerWriter(self.store, spill, settings or WriterSettings())
        self.retention_days = config.ledger_retention_days
        self.rollup_retention_days = rollup_retention(config)
        self._tenancy = tenancy or _tenancy_file(config)
        self._retention: asyncio.Task | None = None
        self._rollup: asyncio.Task | None = None
        if registry is not None:
            metrics.register(registry, self.writer)

    def start(self) -> None:
        """The writer's thread, and the rollup and retention jobs on it (every database call of
        this router runs there, off the router's loop: ``db_thread.py``)."""
        self.writer.start()
        self.writer.thread.soon(self._start_jobs)

    async def query(self, work: Callable[[LedgerStore], Awaitable[T]]) -> T:
        """``work(store)`` on the ledger's thread (a report's queries and the answer built from
        them), awaited from the caller's loop, which stays free meanwhile."""
        self.writer.thread.start()
        return await self.writer.thread.call(lambda: work(self.store))

    async def close(self) -> None:
        """Stop; what is queued is written (or spilled, to be replayed by the next writer here)."""
        if self.writer.thread.running:
            await self.writer.thread.call(self._stop_jobs)
        await self.writer.close()

    # ---- on the ledger's thread -----------------------------------------------------------------
    def _start_jobs(self) -> None:
        loop = asyncio.get_running_loop()
        if self._rollup is None:
            self._rollup = loop.create_task(self._rollup_loop())
        if self._retention is None and (self.retention_days or self.rollup_retention_days) is not None:
            self._retention = loop.create_task(self._retention_loop())

    async def _stop_jobs(self) -> None:
        for task in (self._retention, self._rollup):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._retention = self._rollup = None

    # ---- the request path: no I/O, no await, O(1) ------------------------------------------------
    def record(self, timing: RequestTiming) -> None:
        """The recorder's sink: a finished request becomes a queued row."""
        try:
            self.writer.put(row_from_timing(timing, self.app, self.router, self._pricing(timing.model)))
        except Exception as exc:  # a ledger fault never fails a request
            log.warning("ledger: row of %s not queued: %s", timing.request_id, exc)

    def reject(self, request_id: str, tenant: Tenant, key_id: str, model: str, reason: str | None) -> None:
        """A request refused after authentication before it reached admission (a 400 or 404 on its
        body, a draining router): a row too, so the client's count and the ledger's agree."""
        now = time.monotonic()
        timing = RequestTiming(request_id, tenant.id, tenant.sla_class, now, model=model, key_id=key_id)
        timing.end, timing.outcome, timing.reason = now, "rejected", reason
        self.record(timing)

    @property
    def state(self) -> str:
        """ok, behind (rows waiting longer than they should) or spilling (the database is away)."""
        return self.writer.state

    # ---- jobs on the ledger's thread ---------------------------------------------------------------
    async def _retention_loop(self) -> None:
        while True:
            try:
                now = time.time()
                if self.retention_days is not None:
                    deleted = await self.store.delete_before(now - self.retention_days * 86400)
                    if deleted:
                        log.info("ledger: retention deleted %d rows", deleted)
                if self.rollup_retention_days is not None:
                    cutoff = now - self.rollup_retention_days * 86400
                    deleted = await delete_rollup_before(self.store, cutoff)
                    if deleted:
                        log.info("ledger: retention deleted %d rollup rows", deleted)
            except Exception as exc:  # the database away: the next round tries again
                log.warning("ledger: retention delete failed: %s", exc)
            await asyncio.sleep(RETENTION_EVERY_S)

    async def _rollup_loop(self) -> None:
        """Roll this app's closed dirty hours up (rollup_job.py); catch up in steps when behind."""
        while True:
            rolled = 0
            try:
                if self.writer.migrated:  # the writer's first write applies the migrations
                    rolled = await roll_pending(
                        self.store, self.app, self._tenancy(), limit=ROLLUP_STEP_HOURS
                    )
            except Exception as exc:  # the database away: the next round tries again
                log.warning("ledger: rollup failed: %s", exc)
            await asyncio.sleep(0.1 if rolled >= ROLLUP_STEP_HOURS else ROLLUP_EVERY_S)


def rollup_retention(config: AppConfig) -> float | None:
    """Days the rollup is kept: ``ledger_rollup_retention_days`` where set, never less
    than the rows' (an hour still with rows must keep its rollup: reports read clean hours from it)."""
    rows = config.ledger_retention_days
    rollup = config.ledger_rollup_retention_days
    if rows is None:
        return None  # rows kept for ever: so is the rollup of their hours
    return rows if rollup is None else max(rollup, rows)


def _tenancy_file(config: AppConfig) -> Callable[[], TenancyConfig]:
    """The app's tenancy file, read again each round (a reload of the file reaches the rollup)."""

    def read() -> TenancyConfig:
        path = config.tenancy_config
        return load_tenancy_config(path) if path else default_tenancy_config()

    return read
