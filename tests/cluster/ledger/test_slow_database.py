"""A database ten times slower than the traffic (issue 43): the writer spills what it cannot write
and replays the spill while the traffic goes on, drops nothing, keeps little in memory, and every
row lands once when the database is fast again. The issue asks for 5 minutes; CI runs a few seconds
(``FAIRLANE_LEDGER_SLOW_S=300`` for the full run)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from cluster.ledger.spill import SpillLog
from cluster.ledger.store import LedgerStore
from cluster.ledger.writer import LedgerWriter, WriterSettings
from tests.cluster.ledger.rows_factory import rows
from tests.cluster.ledger.tcp_proxy import TcpProxy
from tests.cluster.ledger.test_writer_interleavings import stored_ids

RATE = 1000  # rows a second
ROW_BYTES = 250  # a row on the wire (COPY, binary)
SECONDS = float(os.environ.get("FAIRLANE_LEDGER_SLOW_S", "5"))
SETTINGS = WriterSettings(write_timeout_s=2.0, spill_after_rows=1000)


async def test_a_database_ten_times_slower_than_the_rows_loses_none(pg_dsn: str, tmp_path: Path) -> None:
    proxy, through = TcpProxy.for_dsn(pg_dsn)
    proxy.start()
    writer = LedgerWriter(LedgerStore(through), SpillLog(tmp_path, "r1", 1_000_000), SETTINGS)
    writer.start()
    put, most_pending, replayed_under_load = [], 0, False
    pool = rows(2000)
    try:
        await writer.flush()  # migrated at full speed: the slowness below is the rows'
        proxy.throttle(RATE * ROW_BYTES / 10)
        end = time.monotonic() + SECONDS
        while time.monotonic() < end:
            for r in pool[:100]:
                r.request_id = f"slow-{len(put):08d}"
                writer.put(type(r)(**r.to_dict()))
                put.append(r.request_id)
            written_before = writer.written
            await asyncio.sleep(0.1)
            most_pending = max(most_pending, writer.pending_rows)
            replayed_under_load |= writer.spill.waiting > 0 and writer.written > written_before
        assert writer.dropped == 0 and not writer.shedding
        assert writer.spilled > 0 and replayed_under_load  # spilled, and replayed meanwhile
        # Memory holds what queued while one insert was on the wire, never the backlog.
        assert most_pending <= SETTINGS.spill_after_rows + SETTINGS.write_rows + 2 * RATE
        proxy.throttle(None)
        async with asyncio.timeout(60):
            while writer.spill.waiting or writer.pending_rows:
                await asyncio.sleep(0.05)
    finally:
        await writer.close()
        proxy.close()
    ids = await stored_ids(pg_dsn)
    assert len(ids) == len(set(ids)) and sorted(ids) == put
