"""A router's ledger keeps the rollup: its job rolls closed hours up, and the rollup's retention
never undercuts the rows'."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import func, select

from cluster.config import AppConfig
from cluster.ledger import router_ledger
from cluster.ledger.rollup_job import HOUR
from cluster.ledger.router_ledger import RouterLedger, rollup_retention
from cluster.ledger.rows import Pricing
from cluster.ledger.schema import rollup, rollup_dirty
from cluster.ledger.store import LedgerStore
from tests.cluster.ledger.rows_factory import rows


async def test_a_router_rolls_closed_hours_up(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hour = math.floor(time.time() / HOUR) * HOUR - 3 * HOUR
    store = LedgerStore(dsn)
    await store.migrate()
    batch = [replace(r, arrival=hour + 60.0 + i, ended=hour + 61.0 + i) for i, r in enumerate(rows(50))]
    await store.insert(batch)
    await store.close()
    where = {"ledger_dsn": dsn} if "://" in dsn else {"ledger_path": dsn}
    config = AppConfig(**where, ledger_spill_dir=str(tmp_path / "spill"))
    monkeypatch.setattr(router_ledger, "ROLLUP_EVERY_S", 0.05)
    ledger = RouterLedger(config, "app", "r1", lambda _model: Pricing(5.0, 4))
    ledger.start()
    try:
        await ledger.writer.flush(force=True)  # the first write migrates; the job waits for it
        for _ in range(200):
            rolled, dirty = await ledger.query(_rolled)  # the store lives on the ledger's thread
            if rolled == 50 and dirty == 0:
                break
            await asyncio.sleep(0.05)
        assert (rolled, dirty) == (50, 0)
    finally:
        await ledger.close()


async def _rolled(store: LedgerStore) -> tuple[int | None, int | None]:
    async with store.connect() as conn:
        rolled = (await conn.execute(select(func.sum(rollup.c.requests)))).scalar()
        dirty = (await conn.execute(select(func.count()).select_from(rollup_dirty))).scalar()
    return rolled, dirty


def test_the_rollup_outlives_the_rows() -> None:
    forever = SimpleNamespace(ledger_retention_days=None, ledger_rollup_retention_days=None)
    assert rollup_retention(forever) is None
    unset = SimpleNamespace(ledger_retention_days=400, ledger_rollup_retention_days=None)
    assert rollup_retention(unset) == 400
    both = SimpleNamespace(ledger_retention_days=30, ledger_rollup_retention_days=800)
    assert rollup_retention(both) == 800
    shorter = SimpleNamespace(ledger_retention_days=400, ledger_rollup_retention_days=30)
    assert rollup_retention(shorter) == 400
    kept = SimpleNamespace(ledger_retention_days=None, ledger_rollup_retention_days=30)
    assert rollup_retention(kept) is None
