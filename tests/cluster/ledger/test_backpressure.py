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
from tests.cluster.ledger.rows_factory import rows
from tests.cluster.ledger.tcp_proxy import TcpProxy
from tests.cluster.ledger.test_writer_interleavings import stored_ids

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


class FailingDisk(SpillLog):
    """A spill log whose disk refuses appends while ``full`` is set (ENOSPC), as a full volume would."""

    full = True

    def append(self, rows):  # type: ignore[override]
        if self.full:
            raise OSError(28, "No space left on device")
        return super().append(rows)


async def test_a_disk_that_refuses_appends_sheds_for_a_while_and_keeps_the_rows(
    pg_dsn: str, tmp_path: Path
) -> None:
    proxy, through = TcpProxy.for_dsn(pg_dsn)
    proxy.start()
    spill = FailingDisk(tmp_path, "r1", max_rows=100_000)
    writer = LedgerWriter(LedgerStore(through), spill, SETTINGS)
    writer.start()
    put = rows(300)
    try:
        proxy.stop()  # the database away: the rows must go to the disk, which refuses them
        for r in put:
            writer.put(r)
        await _until(lambda: writer.spill_errors > 0)
        assert writer.shedding and writer.state == "shedding"
        assert writer.pending_rows == len(put) and writer.dropped == 0  # kept in memory
        spill.full = False  # space again: after the retry interval the router admits and spills
        await _until(lambda: not writer.shedding and writer.spill.waiting == len(put))
        proxy.start()
        await _until(lambda: writer.spill.waiting == 0 and writer.pending_rows == 0)
    finally:
        await writer.close()
        proxy.close()
    assert writer.dropped == 0
    assert sorted(await stored_ids(pg_dsn)) == sorted(r.request_id for r in put)
