"""The ledger off the router's loop (issue 22): every database call of a router runs on the ledger's
own thread, the router only queues rows, and the thread keeps every guarantee of the writer: the
close writes all that was accepted, an outage spills and the spill is replayed."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from cluster.config import AppConfig
from cluster.ledger import router_ledger
from cluster.ledger.router_ledger import RouterLedger
from cluster.ledger.rows import Pricing
from cluster.ledger.schema import requests
from cluster.ledger.spill import SpillLog
from cluster.ledger.store import LedgerStore
from cluster.ledger.writer import LedgerWriter, WriterSettings
from tests.cluster.ledger.rows_factory import rows

SLOW = WriterSettings(interval_s=60.0, batch_rows=100_000, retry_s=0.2)  # only a flush writes


class ThreadSpy:
    """Wraps a store's coroutine methods and notes the thread each call ran on."""

    def __init__(self, store: LedgerStore, names: tuple[str, ...]) -> None:
        self.threads: list[threading.Thread] = []
        for name in names:
            setattr(store, name, self._wrap(getattr(store, name)))

    def _wrap(self, method):
        async def spied(*args, **kwargs):
            self.threads.append(threading.current_thread())
            return await method(*args, **kwargs)

        return spied


async def _stored(dsn: str, app: str = "app") -> int:
    store = LedgerStore(dsn)
    try:
        return await store.count(app)
    finally:
        await store.close()


async def test_database_calls_run_on_the_ledger_thread_and_the_close_stores_every_row(
    dsn: str, tmp_path: Path
) -> None:
    store = LedgerStore(dsn)
    spy = ThreadSpy(store, ("migrate", "insert", "close"))
    writer = LedgerWriter(store, SpillLog(tmp_path, "r1", 100_000), SLOW)
    writer.start()
    for r in rows(1500):
        writer.put(r)  # the long interval: nothing is written until the close
    assert writer.pending_rows == 1500
    await writer.close()
    loop_thread = threading.current_thread()
    assert spy.threads and loop_thread not in spy.threads
    assert {t.name for t in spy.threads} == {writer.thread.name}
    assert not writer.thread.running
    assert await _stored(dsn) == 1500
    assert writer.pending_rows == 0 and writer.dropped == 0 and writer.written == 1500
    assert not [p for p in tmp_path.glob("ledger-spill-*.jsonl") if p.stat().st_size]
    await writer.close()  # a second close (a router stopped twice) does nothing


async def test_a_failing_database_spills_and_the_thread_replays(sqlite_dsn: str, tmp_path: Path) -> None:
    """Inserts fail for a while: the rows go to the spill file, /health's state (read from the
    router's loop) says spilling, and once inserts succeed the spill file is replayed, once each."""
    store = LedgerStore(sqlite_dsn)
    real_insert = store.insert
    failing = threading.Event()
    failing.set()

    async def insert(batch):
        if failing.is_set():
            raise ConnectionError("database away")
        await real_insert(batch)

    store.insert = insert  # type: ignore[method-assign]
    writer = LedgerWriter(store, SpillLog(tmp_path, "r1", 100_000), SLOW)
    writer.start()
    try:
        for r in rows(300, seed=1):
            writer.put(r)
        await writer.flush(force=True)
        assert writer.spill.waiting == 300 and writer.state == "spilling" and writer.write_errors == 1
        for r in rows(200, seed=2):
            writer.put(r)
        failing.clear()
        await asyncio.sleep(SLOW.retry_s)
        await writer.flush()  # past the back-off: the spill file first, then the queue
        assert writer.spill.waiting == 0 and writer.state == "ok"
        assert await _stored(sqlite_dsn) == 500
    finally:
        await writer.close()
    assert await _stored(sqlite_dsn) == 500


async def test_a_full_queue_drops_and_counts_without_blocking(sqlite_dsn: str, tmp_path: Path) -> None:
    settings = WriterSettings(interval_s=60.0, batch_rows=100_000, queue_rows=50)
    writer = LedgerWriter(LedgerStore(sqlite_dsn), SpillLog(tmp_path, "r1", 100_000), settings)
    writer.start()
    for r in rows(80):
        writer.put(r)
    assert writer.pending_rows == 50 and writer.dropped == 30
    await writer.close()
    assert await _stored(sqlite_dsn) == 50
    writer.put(rows(1, seed=5)[0])  # after the close: refused, counted
    assert writer.dropped == 31


async def test_a_database_slower_than_the_rows_spills_them_instead_of_dropping(
    sqlite_dsn: str, tmp_path: Path
) -> None:
    """Every insert answers, but at 200 rows/s against 500 coming: the queue would pass its bound
    (300) within a second and drop. The rows queued after each write go to the spill file instead,
    also while an earlier spill is being replayed, and all of them land."""
    store = LedgerStore(sqlite_dsn)
    real_insert = store.insert

    async def slow_insert(batch):
        await asyncio.sleep(0.2)
        return await real_insert(batch)

    store.insert = slow_insert
    settings = WriterSettings(interval_s=0.01, batch_rows=10, queue_rows=300, spill_after_rows=50)
    writer = LedgerWriter(store, SpillLog(tmp_path, "r1", 100_000), settings)
    writer.start()
    writer.put(rows(1, seed=99)[0])
    await writer.flush()  # migrated and writing: the stream of rows starts now
    try:
        for chunk in range(20):  # 1,000 more rows over 2 s
            for r in rows(50, seed=100 + chunk):
                writer.put(r)
            await asyncio.sleep(0.1)
        assert writer.dropped == 0 and writer.spill.waiting > 0  # it fell behind, and spilled
        assert await _wait(lambda: writer.pending_rows == 0 and writer.spill.waiting == 0, 30)
    finally:
        await writer.close(timeout_s=30)
    assert writer.dropped == 0
    assert await _stored(sqlite_dsn) == 1001


async def _wait(predicate, timeout_s: float) -> bool:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.05)
    return True


async def test_a_close_ends_a_writing_task_that_swallowed_its_cancel(sqlite_dsn: str, tmp_path: Path) -> None:
    """On Python 3.11 ``asyncio.wait_for`` returns normally when a cancel races the result it waited
    for (the writer's own wake-up wait did so, a driver's may): the writing task then runs on. The
    close must still end it, and store every row."""
    store = LedgerStore(sqlite_dsn)
    real_insert, inserting, swallowed = store.insert, threading.Event(), []

    async def insert_swallowing_one_cancel(batch):
        if not swallowed:
            inserting.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                swallowed.append(True)
        return await real_insert(batch)

    store.insert = insert_swallowing_one_cancel
    settings = WriterSettings(interval_s=0.05, batch_rows=100, write_timeout_s=60.0)
    writer = LedgerWriter(store, SpillLog(tmp_path, "r1", 100_000), settings)
    writer.start()
    for r in rows(50):
        writer.put(r)
    assert await asyncio.to_thread(inserting.wait, 10)
    async with asyncio.timeout(20):  # before the fix: forever, the task never ended
        await writer.close(timeout_s=3)
    assert swallowed and not writer.thread.running
    assert await _stored(sqlite_dsn) == 50


async def test_a_routers_reports_and_rollup_run_on_the_ledger_thread(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_threads: list[threading.Thread] = []
    real_roll = router_ledger.roll_pending

    async def roll(*args, **kwargs):
        job_threads.append(threading.current_thread())
        return await real_roll(*args, **kwargs)

    monkeypatch.setattr(router_ledger, "roll_pending", roll)
    monkeypatch.setattr(router_ledger, "ROLLUP_EVERY_S", 0.05)
    where = {"ledger_dsn": dsn} if "://" in dsn else {"ledger_path": dsn}
    config = AppConfig(**where, ledger_spill_dir=str(tmp_path / "spill"))
    ledger = RouterLedger(config, "app", "r1", lambda _model: Pricing(5.0, 4))
    ledger.start()
    try:
        for r in rows(40):
            ledger.writer.put(r)
        await ledger.writer.flush()

        async def count(store: LedgerStore) -> tuple[int, str]:
            async with store.connect() as conn:
                n = (await conn.execute(select(func.count()).select_from(requests))).scalar()
                await conn.execute(text("SELECT 1"))
            return int(n or 0), threading.current_thread().name

        stored, where_run = await ledger.query(count)
        assert stored == 40 and where_run == ledger.writer.thread.name
        for _ in range(100):
            if job_threads:
                break
            await asyncio.sleep(0.05)
        assert job_threads and {t.name for t in job_threads} == {ledger.writer.thread.name}
    finally:
        await ledger.close()
    assert not ledger.writer.thread.running
