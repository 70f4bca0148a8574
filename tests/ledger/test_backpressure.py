"""Backpressure (issue 43): a router whose spill is nearly full sheds new requests with a 503 rather
than serve them and drop their rows; the rows of requests already admitted still fit, and once the
database is back the replay makes room and the router serves again."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from cluster.errors import error_response
from cluster.ledger.backpressure import LedgerFull
from cluster.ledger.spill import SpillLog
from cluster.ledger.store import LedgerStore
from cluster.ledger.writer import LedgerWriter, WriterSettings
from tests.ledger.rows_factory import rows
from tests.ledger.tcp_proxy import TcpProxy
from tests.ledger.test_writer_interleavings import stored_ids

SETTINGS = WriterSettings(interval_s=0.05, retry_s=0.2, write_timeout_s=2.0)


async def _until(predicate, timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.02)


async def test_a_full_spill_sheds_new_requests_and_drops_no_row(pg_dsn: str, tmp_path: Path) -> None:
    proxy, through = TcpProxy.for_dsn(pg_dsn)
    proxy.start()
    writer = LedgerWriter(LedgerStore(through), SpillLog(tmp_path, "r1", max_rows=1000), SETTINGS)
    writer.start()
    put = []
    try:
        proxy.stop()
        while not writer.shedding:  # a router admits while its ledger is not shedding
            batch = rows(40, seed=len(put))
            for r in batch:
                writer.put(r)
            put += batch
            await asyncio.sleep(0.02)
        assert writer.state == "shedding" and writer.spill.rows >= 900
        admitted = rows(150, seed=10**6)  # requests admitted before the shed, ending now
        for r in admitted:
            writer.put(r)
        put += admitted
        await asyncio.sleep(0.3)  # spool ticks: the file is full, the rows wait in memory
        assert writer.dropped == 0 and writer.pending_rows + writer.spill.rows == len(put)
        proxy.start()
        await _until(lambda: not writer.shedding)  # the replay made room: the router serves again
        await _until(lambda: writer.spill.waiting == 0 and writer.pending_rows == 0)
    finally:
        await writer.close()
        proxy.close()
    ids = await stored_ids(pg_dsn)
    assert writer.dropped == 0
    assert sorted(ids) == sorted(r.request_id for r in put)


def test_a_shed_request_gets_a_503_that_says_when_to_retry() -> None:
    response = error_response(LedgerFull())
    assert response.status_code == 503
    assert response.headers["retry-after"] == "5"
    assert json.loads(response.body)["error"]["code"] == "ledger_full"
