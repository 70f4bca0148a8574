"""A database that answers but takes rows slower than they come: the backlog waits in the spill file,
not in a queue that would drop rows past its bound; and a replay moves its file aside, so what is
spilled while it runs is kept."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cluster.ledger.spill import SpillFile
from cluster.ledger.store import LedgerStore
from cluster.ledger.writer import LedgerWriter, WriterSettings
from tests.ledger.rows_factory import rows

# A batch of at most 40 rows per 50 ms insert: 800 rows/s at best, against 2,000 rows/s put for 2 s.
# The queue holds 20x the backlog that is spilled (the defaults: 5x), room for what arrives during
# one insert on a busy box; without the spill the backlog passes it after about 1.5 s.
SETTINGS = WriterSettings(interval_s=0.01, batch_rows=10, queue_rows=1000, spill_backlog_rows=50)
ROWS = 4000


def slow_store(dsn: str, delay_s: float = 0.05) -> LedgerStore:
    store = LedgerStore(dsn)
    real_insert = store.insert

    async def insert(batch):
        await asyncio.sleep(delay_s)
        await real_insert(batch)

    store.insert = insert  # type: ignore[method-assign]
    return store


async def _stored(dsn: str) -> int:
    store = LedgerStore(dsn)
    try:
        return await store.count("app")
    finally:
        await store.close()


async def test_a_slow_database_spills_the_backlog_and_loses_nothing(sqlite_dsn: str, tmp_path: Path) -> None:
    writer = LedgerWriter(slow_store(sqlite_dsn), SpillFile(tmp_path / "spill", "r1", 100_000), SETTINGS)
    writer.start()
    arriving = rows(ROWS)
    for i in range(0, len(arriving), 20):
        for row in arriving[i : i + 20]:
            writer.put(row)
        await asyncio.sleep(0.01)
    assert writer.dropped == 0, (writer.queue_dropped, writer.spill.dropped)
    assert writer.backlog_spilled > 0  # the database fell behind, and the backlog went to disk
    await writer.close(timeout_s=60)
    assert writer.dropped == 0
    assert await _stored(sqlite_dsn) == ROWS


def test_a_replay_moves_its_file_aside_and_new_spills_start_a_fresh_one(tmp_path: Path) -> None:
    spill = SpillFile(tmp_path, "r1", max_rows=100)
    spill.append(rows(5))
    with spill.taken() as taken:
        assert len(taken) == 5 and spill.rows == 0
        spill.append(rows(3, seed=2))  # spilled while the replay runs
        aside = [p for p in tmp_path.glob("ledger-spill-r1-replay-*.jsonl")]
        assert len(aside) == 1
        assert spill.others() == aside
        with spill.adopt(aside[0]) as adopted:
            assert adopted is None  # still ours: locked
    assert not list(tmp_path.glob("ledger-spill-r1-replay-*.jsonl"))  # stored: gone
    assert len(spill.read_own()) == 3 and spill.rows == 3
    spill.close()


def test_a_replay_that_fails_leaves_its_rows_to_the_next_one(tmp_path: Path) -> None:
    spill = SpillFile(tmp_path, "r1", max_rows=100)
    spill.append(rows(4))
    with pytest.raises(ConnectionError), spill.taken():
        raise ConnectionError("database away mid-replay")
    (aside,) = spill.others()
    with spill.adopt(aside) as adopted:
        assert adopted is not None and len(adopted) == 4
    assert not aside.exists()
    spill.close()
