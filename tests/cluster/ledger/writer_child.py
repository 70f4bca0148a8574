"""A process holding a ledger writer, for the kill -9 drill (``test_writer_kill.py``): it puts rows
``kill-<seq>`` at a steady rate and prints ``put <n> spilled <m> written <k>`` every 50 ms."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from cluster.ledger.spill import SpillLog
from cluster.ledger.store import LedgerStore
from cluster.ledger.writer import LedgerWriter, WriterSettings
from tests.cluster.ledger.rows_factory import rows

SETTINGS = WriterSettings(interval_s=0.05, retry_s=0.2, write_timeout_s=2.0)


async def main(dsn: str, folder: str, rate: int, start: int) -> None:
    writer = LedgerWriter(LedgerStore(dsn), SpillLog(Path(folder), "child", 1_000_000), SETTINGS)
    writer.start()
    template = rows(1)[0]
    seq, step = start, 0.05
    while True:
        for _ in range(max(1, int(rate * step))):
            template.request_id = f"kill-{seq:08d}"
            writer.put(type(template)(**template.to_dict()))
            seq += 1
        print(f"put {seq} spilled {writer.spilled} written {writer.written}", flush=True)
        await asyncio.sleep(step)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
