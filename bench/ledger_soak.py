"""Ledger soak (issue 43): rows lost and rows doubled over a long run whose database is throttled
below the traffic, restarted, and whose writer is restarted while it spills.

    nice -n 10 python -m bench.ledger_soak --minutes 30 --json docs/bench/ledger_soak_<date>.json

One writer at a time (the router's: its own thread, default settings) takes ``--rate`` rows a second
from a paced producer; PostgreSQL (``FAIRLANE_TEST_PG_DSN``, a fresh database) sits behind the
tests' TCP forwarder. Each cycle (``--cycle-s``): the database at full speed; throttled to a tenth
of the traffic (the forwarder's bandwidth), the writer closed mid-spill and a new one started that
adopts its spill files; a restart (connections cut, the port refusing); full speed again. At the
end, the forwarder at full speed, every spill file replayed, the database is read: every request id
put must be there once. Light on CPU by design: 100 rows/s, a tenth of a core or less.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

from cluster.ledger.rows import LedgerRow
from cluster.ledger.spill import SpillLog
from cluster.ledger.store import LedgerStore
from cluster.ledger.writer import LedgerWriter, WriterSettings
from tests.cluster.ledger.postgres_server import configured_dsn
from tests.cluster.ledger.tcp_proxy import TcpProxy

APP = "soak"
ROW_BYTES = 250  # about what a row costs on the wire (COPY, binary): the throttle's unit
PHASES = (("full", 0.25), ("throttled", 0.40), ("restart", 0.10), ("full", 0.25))


def make_row(seq: int, router: str) -> LedgerRow:
    now = time.time()
    return LedgerRow(
        f"soak-{seq:09d}", APP, router, f"t{seq % 7}", f"key_{seq % 7}", "m", "standard",
        now - 0.5, now, 0.01, 0.1, 0.02, 0.03, 0.5, 100, 10, 20, "ok", None, 0.1, 1e-5,
    )  # fmt: skip


class Soak:
    def __init__(self, args: argparse.Namespace, dsn: str, spill_dir: Path) -> None:
        self.args = args
        self.proxy, self.through = TcpProxy.for_dsn(dsn)
        self.spill_dir = spill_dir
        self.writer = self._new_writer()
        self.retired: list[LedgerWriter] = []
        self.put = 0
        self.samples: list[dict] = []
        self.phase_log: list[dict] = []
        self.max_spilled = 0
        self.states: set[str] = set()

    def _new_writer(self) -> LedgerWriter:
        spill = SpillLog(self.spill_dir, f"soak-{uuid.uuid4().hex[:6]}", 1_000_000)
        writer = LedgerWriter(LedgerStore(self.through), spill, WriterSettings())
        writer.start()
        return writer

    async def restart_writer(self) -> None:
        """A router replaced mid-spill: the new writer serves, the old one closes (spilling what the
        throttled database does not take in its bounded close) and the new one adopts its files."""
        old, self.writer = self.writer, self._new_writer()
        await old.close(timeout_s=2.0)
        self.retired.append(old)

    async def produce(self, until: float) -> None:
        step = 0.1
        per_step = max(1, round(self.args.rate * step))
        next_at = time.monotonic()
        while time.monotonic() < until:
            for _ in range(per_step):
                self.writer.put(make_row(self.put, "soak"))
                self.put += 1
            next_at += step
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def watch(self, until: float) -> None:
        last = 0.0
        while time.monotonic() < until:
            w = self.writer
            self.max_spilled = max(self.max_spilled, w.spill.waiting)
            self.states.add(w.state)
            if time.monotonic() - last >= 30:
                last = time.monotonic()
                self.samples.append(
                    {"t": round(time.time()), "put": self.put, "stored": self.stored_total(),
                     "spilled_now": w.spill.waiting, "pending": w.pending_rows, "state": w.state}
                )  # fmt: skip
            await asyncio.sleep(0.5)

    def stored_total(self) -> int:
        return sum(w.written for w in [*self.retired, self.writer])

    async def phase(self, name: str, seconds: float) -> None:
        began = time.monotonic()
        stored_before = self.stored_total()
        self.proxy.throttle(self.args.rate * ROW_BYTES / 10 if name == "throttled" else None)
        if name == "restart":
            self.proxy.stop()
        work = [self.produce(began + seconds), self.watch(began + seconds)]
        if name == "throttled":
            work.append(self._restart_midway(began + seconds / 2))
        await asyncio.gather(*work)
        self.proxy.start()
        took = time.monotonic() - began
        rate = (self.stored_total() - stored_before) / took
        self.phase_log.append({"phase": name, "s": round(took, 1), "db_rows_per_s": round(rate, 1)})

    async def _restart_midway(self, at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        await self.restart_writer()

    async def finish(self) -> None:
        """Full speed, the last writer closed, a fresh one replays every file left, then closes."""
        self.proxy.throttle(None)
        self.proxy.start()
        await self.writer.close(timeout_s=60)
        self.retired.append(self.writer)
        self.writer = self._new_writer()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and _spill_files(self.spill_dir):
            await asyncio.sleep(1)
        await self.writer.close(timeout_s=60)
        self.retired.append(self.writer)


def _spill_files(folder: Path) -> list[Path]:
    return [p for p in folder.glob("ledger-spill-*.jsonl") if p.stat().st_size]


async def count(dsn: str, put: int) -> dict:
    conn = await asyncpg.connect(dsn)
    try:
        rows, distinct = await conn.fetchrow(
            "SELECT count(*), count(DISTINCT request_id) FROM ledger_requests WHERE app = $1", APP
        )
        ids = {r[0] for r in await conn.fetch("SELECT request_id FROM ledger_requests WHERE app = $1", APP)}
    finally:
        await conn.close()
    expected = {f"soak-{i:09d}" for i in range(put)}
    return {
        "rows_stored": rows,
        "rows_lost": len(expected - ids),
        "rows_doubled": rows - distinct,
        "rows_unexpected": len(ids - expected),
    }


async def run(args: argparse.Namespace) -> dict:
    server = os.environ.get("FAIRLANE_TEST_PG_DSN") or configured_dsn()
    name = f"fl_soak_{int(time.time())}"
    admin = await asyncpg.connect(server)
    await admin.execute(f"CREATE DATABASE {name}")
    await admin.close()
    dsn = server.rsplit("/", 1)[0] + f"/{name}"
    began, cpu0, commit = time.time(), _cpu(), _commit()  # the tree this process loaded
    with tempfile.TemporaryDirectory(prefix="ledger-soak-") as spill_dir:
        soak = Soak(args, dsn, Path(spill_dir))
        soak.proxy.start()
        end = time.monotonic() + args.minutes * 60
        while time.monotonic() < end:
            for phase, share in PHASES:
                seconds = min(args.cycle_s * share, max(0.0, end - time.monotonic()))
                if seconds > 0:
                    await soak.phase(phase, seconds)
        load_s = time.time() - began
        await soak.finish()
        soak.proxy.close()
    figures = await count(dsn, soak.put)
    writers = soak.retired
    return {
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit,
        "command": f"nice -n 10 python -m bench.ledger_soak --minutes {args.minutes} --rate {args.rate}",
        "minutes_of_load": round(load_s / 60, 2),
        "rate_rows_per_s": args.rate,
        "rows_put": soak.put,
        **figures,
        "rows_dropped_counted": sum(w.dropped for w in writers),
        "rows_spilled": sum(w.spilled for w in writers),
        "max_rows_spilled_at_once": soak.max_spilled,
        "write_errors": sum(w.write_errors for w in writers),
        "writers": len(writers),
        "states_seen": sorted(soak.states),
        "cpu_s": round(_cpu() - cpu0, 1),
        "cpu_share_of_one_core": round((_cpu() - cpu0) / (time.time() - began), 3),
        "wall_s": round(time.time() - began, 1),
        "phases": soak.phase_log,
        "samples": soak.samples,
    }


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=int, default=100, help="rows put a second")
    parser.add_argument("--cycle-s", type=float, default=180.0, help="one full/throttled/restart cycle")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    if result["rows_lost"] or result["rows_doubled"] or result["rows_unexpected"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
