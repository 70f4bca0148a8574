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
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry

from cluster.config import AppConfig
from cluster.ledger import metrics
from cluster.ledger.rows import Pricing, row_from_timing
from cluster.ledger.spill import SpillFile
from cluster.ledger.store import LedgerStore
from cluster.ledger.writer import LedgerWriter, WriterSettings
from cluster.telemetry.request_timing import RequestTiming
from tenancy import Tenant

log = logging.getLogger(__name__)
DSN_ENV = "FAIRLANE_LEDGER_DSN"
RETENTION_EVERY_S = 3600.0


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
    ) -> None:
        """``pricing``: a model's price and room now (the tenancy can be reloaded)."""
        self.app = app
        self.router = router
        self._pricing = pricing
        self.store = LedgerStore(ledger_dsn(config))
        spill = SpillFile(Path(config.ledger_spill_dir), f"{app}-{router}", config.ledger_spill_max_rows)
        self.writer = LedgerWriter(self.store, spill, settings or WriterSettings())
        self.retention_days = config.ledger_retention_days
        self._retention: asyncio.Task | None = None
        if registry is not None:
            metrics.register(registry, self.writer)

    def start(self) -> None:
        self.writer.start()
        if self.retention_days is not None and self._retention is None:
            self._retention = asyncio.get_running_loop().create_task(self._retention_loop())

    async def close(self) -> None:
        """Stop; what is queued is written (or spilled, to be replayed by the next writer here)."""
        if self._retention is not None:
            self._retention.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retention
        await self.writer.close()

    # ---- the request path: no I/O, no await ----------------------------------------------------
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

    async def _retention_loop(self) -> None:
        while True:
            try:
                cutoff = time.time() - self.retention_days * 86400  # type: ignore[operator]
                deleted = await self.store.delete_before(cutoff)
                if deleted:
                    log.info("ledger: retention deleted %d rows", deleted)
            except Exception as exc:  # the database away: the next round tries again
                log.warning("ledger: retention delete failed: %s", exc)
            await asyncio.sleep(RETENTION_EVERY_S)
