"""The ledger database, PostgreSQL and SQLite alike: migrations once, inserts once, retention."""

from __future__ import annotations

import asyncio
import time

from sqlalchemy import text

from cluster.ledger.store import LedgerStore, engine_url, migration_files
from tests.cluster.ledger.rows_factory import rows


async def test_migrations_apply_once_when_routers_start_together(dsn: str) -> None:
    stores = [LedgerStore(dsn) for _ in range(5)]
    try:
        versions = await asyncio.gather(*(s.migrate() for s in stores))
        latest = migration_files()[-1][0]
        assert versions == [latest] * 5
        assert await stores[0].migrate() == latest  # a later start changes nothing
        async with stores[0].connect() as conn:
            applied = (await conn.execute(text("SELECT version FROM schema_version"))).scalars().all()
        assert sorted(applied) == [v for v, _ in migration_files()]
    finally:
        for s in stores:
            await s.close()


async def test_a_row_sent_twice_is_stored_once(dsn: str) -> None:
    store = LedgerStore(dsn)
    try:
        await store.migrate()
        batch = rows(50)
        await store.insert(batch)
        await store.insert(batch[10:30] + rows(5, seed=8))  # a replay overlapping new rows
        assert await store.count("app") == 55
    finally:
        await store.close()


async def test_the_adapter_a_request_ran_with_is_stored(dsn: str) -> None:
    store = LedgerStore(dsn)
    try:
        await store.migrate()
        batch = rows(4, seed=3)
        batch[0].adapter = "acme-sql"
        await store.insert(batch)
        async with store.connect() as conn:
            stored = await conn.execute(text("SELECT request_id, adapter FROM ledger_requests"))
            adapters = dict(stored.all())
        assert adapters[batch[0].request_id] == "acme-sql"
        assert [adapters[r.request_id] for r in batch[1:]] == [None, None, None]
    finally:
        await store.close()


async def test_retention_deletes_rows_older_than_the_cutoff(dsn: str) -> None:
    store = LedgerStore(dsn)
    try:
        await store.migrate()
        old, new = rows(10, seed=1), rows(10, seed=2)
        for r in old:
            r.arrival -= 500 * 86400
            r.ended -= 500 * 86400
        await store.insert(old + new)
        assert await store.delete_before(time.time() - 400 * 86400) == 10
        assert await store.count("app") == 10
    finally:
        await store.close()


def test_dsns_and_paths_become_async_urls() -> None:
    assert engine_url("postgresql://u:p@db:5432/x") == "postgresql+asyncpg://u:p@db:5432/x"
    assert engine_url("/var/lib/ledger.sqlite") == "sqlite+aiosqlite:////var/lib/ledger.sqlite"
    assert engine_url("sqlite:///rel.db") == "sqlite+aiosqlite:///rel.db"
