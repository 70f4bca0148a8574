"""Random interleavings of put, spill, replay, outages and close (issue 43): whatever the order, every
row put is stored exactly once and none is dropped. Plain ``random`` with fixed seeds, so a failing
seed replays; the database is the real PostgreSQL behind the tests' forwarder (an outage refuses
and cuts), the writer's own tasks are not started: each step is one of its operations, run on its
thread as the tasks would run it, some of them at once (a close racing a spill)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import asyncpg
import pytest

from cluster.ledger.rows import LedgerRow
from cluster.ledger.spill import SpillLog
from cluster.ledger.store import LedgerStore
from cluster.ledger.writer import LedgerWriter, WriterSettings
from tests.cluster.ledger.rows_factory import rows
from tests.cluster.ledger.tcp_proxy import TcpProxy

SEEDS = range(10)
STEPS = 14
# Small everything, so that a few hundred rows make many segments, chunks and spills.
SETTINGS = WriterSettings(write_rows=64, retry_s=0.0, write_timeout_s=3.0, spill_after_rows=120)


class Drill:
    def __init__(self, rng: random.Random, proxy: TcpProxy, dsn: str, folder: Path) -> None:
        self.rng, self.proxy, self.dsn, self.folder = rng, proxy, dsn, folder
        self.put: list[LedgerRow] = []
        self.dropped = 0
        self.writer = self._writer()

    def _writer(self) -> LedgerWriter:
        owner = f"r{self.rng.randrange(1000)}"
        spill = SpillLog(self.folder, owner, max_rows=100_000, segment_rows=self.rng.choice([7, 50, 400]))
        writer = LedgerWriter(LedgerStore(self.dsn), spill, SETTINGS)
        writer.thread.start()  # no tasks: the drill's steps are the only work
        return writer

    async def on_thread(self, work) -> None:
        await self.writer.thread.call(work)

    async def step(self) -> str:
        op = self.rng.choice(["put", "put", "spool", "drain", "drain", "outage", "close", "close_in_spill"])
        w = self.writer
        if op == "put":
            batch = rows(self.rng.randint(1, 300), seed=self.rng.randrange(1 << 30))
            for r in batch:
                w.put(r)
            self.put += batch
        elif op == "spool":
            w.spilling = w.spilling or self.rng.random() < 0.5  # as a failed write would
            await self.on_thread(w.spool)
        elif op == "drain":
            for _ in range(self.rng.randint(1, 6)):
                await self.on_thread(w.drain_step)
        elif op == "outage":
            self.proxy.stop() if self.rng.random() < 0.5 else self.proxy.start()
        else:  # a router replaced: the close (racing a spill, or not), then a new writer here
            if op == "close_in_spill":
                w.spilling = True
                spill = w.thread.call(w.spool)
                await asyncio.gather(spill, w.close(timeout_s=1.0), return_exceptions=True)
            else:
                await w.close(timeout_s=1.0)
            self.dropped += w.dropped
            self.writer = self._writer()
        return op

    async def finish(self) -> None:
        """The database back, the writer closed, a last one adopting every file left, then closed."""
        self.proxy.start()
        await self.writer.close(timeout_s=10)
        self.dropped += self.writer.dropped
        last = LedgerWriter(LedgerStore(self.dsn), SpillLog(self.folder, "last", 100_000), SETTINGS)
        last.start()
        async with asyncio.timeout(60):
            while rows_left_on_disk(self.folder):
                await asyncio.sleep(0.05)
        await last.close()
        self.dropped += last.dropped


def rows_left_on_disk(folder: Path) -> bool:
    """Whether a spill file with rows in it is left. The adopting writer deletes a file once it is
    replayed, so one listed may be gone by the time its size is read: gone is empty."""
    for path in folder.glob("ledger-spill-*.jsonl"):
        try:
            if path.stat().st_size:
                return True
        except FileNotFoundError:
            continue
    return False


async def stored_ids(dsn: str) -> list[str]:
    conn = await asyncpg.connect(dsn)
    try:
        return [r[0] for r in await conn.fetch("SELECT request_id FROM ledger_requests")]
    finally:
        await conn.close()


@pytest.mark.parametrize("seed", SEEDS)
async def test_any_interleaving_stores_every_row_once(pg_dsn: str, tmp_path: Path, seed: int) -> None:
    proxy, through = TcpProxy.for_dsn(pg_dsn)
    proxy.start()
    drill = Drill(random.Random(seed), proxy, through, tmp_path)
    ops = []
    try:
        for _ in range(STEPS):
            ops.append(await drill.step())
        await drill.finish()
    finally:
        proxy.close()
    ids = await stored_ids(pg_dsn)
    assert drill.dropped == 0, ops
    assert len(ids) == len(set(ids))  # none doubled
    assert sorted(ids) == sorted(r.request_id for r in drill.put), ops  # none lost, none made up
