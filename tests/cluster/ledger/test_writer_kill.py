"""kill -9 of the process holding the writer, mid-spill and then mid-replay (issue 43): every row that
had reached the spill file or the database is stored exactly once after the restart. What a kill can
take is only what was still in memory: rows newer than every durable one, put in the last moments."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import asyncpg
import orjson

from cluster.ledger.spill import SpillLog
from cluster.ledger.store import LedgerStore
from cluster.ledger.writer import LedgerWriter
from tests.cluster.ledger.tcp_proxy import TcpProxy
from tests.cluster.ledger.writer_child import SETTINGS

RATE = 400  # rows a second


class Child:
    """``writer_child`` in a process of its own; reads its progress lines."""

    def __init__(self, dsn: str, folder: Path, start: int) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.cluster.ledger.writer_child",
                dsn,
                str(folder),
                str(RATE),
                str(start),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.put = self.spilled = self.written = 0

    async def until(self, predicate, timeout_s: float = 60.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not predicate(self):
                line = await asyncio.to_thread(self.proc.stdout.readline)
                assert line, "the child ended"
                _, put, _, spilled, _, written = line.split()
                self.put, self.spilled, self.written = int(put), int(spilled), int(written)

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.proc.stdout.close()


def spilled_ids(folder: Path) -> set[str]:
    """The rows on disk now: every whole line of every spill file."""
    out = set()
    for path in folder.glob("ledger-spill-*.jsonl"):
        for line in path.read_bytes().splitlines():
            try:
                out.add(orjson.loads(line)["request_id"])
            except (orjson.JSONDecodeError, KeyError):
                continue  # the line the kill cut
    return out


async def stored(dsn: str) -> list[str]:
    conn = await asyncpg.connect(dsn)
    try:
        return [r[0] for r in await conn.fetch("SELECT request_id FROM ledger_requests")]
    except asyncpg.UndefinedTableError:
        return []
    finally:
        await conn.close()


async def test_kill_9_mid_spill_and_mid_replay_loses_no_durable_row(pg_dsn: str, tmp_path: Path) -> None:
    proxy, through = TcpProxy.for_dsn(pg_dsn)
    proxy.start()
    try:
        first = Child(through, tmp_path, 0)
        await first.until(lambda c: c.written >= 200)  # writing directly
        proxy.stop()  # the database away: the child spills
        await first.until(lambda c: c.spilled >= 1500)
        first.kill()  # mid-spill
        durable = spilled_ids(tmp_path) | set(await stored(pg_dsn))
        put_before_kill = first.put
        proxy.throttle(RATE * 250 / 10)  # back, but a tenth as fast as the rows
        proxy.start()
        second = Child(through, tmp_path, 1_000_000)  # adopts the dead child's files, slowly
        await second.until(lambda c: c.written >= 100, timeout_s=120)
        second.kill()  # mid-replay (and mid-spill of its own rows)
        durable |= spilled_ids(tmp_path) | set(await stored(pg_dsn))
        proxy.throttle(None)
        last = LedgerWriter(LedgerStore(through), SpillLog(tmp_path, "last", 1_000_000), SETTINGS)
        last.start()
        async with asyncio.timeout(120):
            while [p for p in tmp_path.glob("ledger-spill-*.jsonl") if p.stat().st_size]:
                await asyncio.sleep(0.1)
        await last.close()
    finally:
        proxy.close()
    ids = await stored(pg_dsn)
    assert len(ids) == len(set(ids))  # none doubled
    assert durable <= set(ids)  # every row that was on disk or stored at a kill: present
    assert len(durable) >= 1500
    first_run = sorted(i for i in ids if i < "kill-01000000")
    lost = [f"kill-{n:08d}" for n in range(put_before_kill) if f"kill-{n:08d}" not in set(first_run)]
    newest_durable = max(i for i in durable if i < "kill-01000000")
    assert all(i > newest_durable for i in lost)  # only rows newer than every durable one
    assert len(lost) <= RATE  # at most the last second's rows, still in memory at the kill
