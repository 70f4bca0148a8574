"""CPU per row of the ledger's SQLite insert (the embedded default's store), batches as the writer
sends them: ``--batches`` inserts of ``--rows`` rows each into a fresh file, after two warm-up
batches. CPU is the process's, every thread (aiosqlite runs the statements on a thread of its own).

    python -m bench.ledger_sqlite_insert --json docs/bench/cpu_ledger_sqlite_insert.json [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

from bench.ledger_soak import make_row
from cluster.ledger.store import LedgerStore


async def one_run(batches: int, rows: int) -> dict:
    folder = tempfile.mkdtemp(prefix="ledger-insert-")
    store = LedgerStore(f"sqlite:///{folder}/ledger.sqlite")
    await store.migrate()
    seq = 0
    for _ in range(2):  # warm-up: connections, statement caches
        await store.insert([make_row(seq + i, "router-1") for i in range(rows)])
        seq += rows
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for _ in range(batches):
        await store.insert([make_row(seq + i, "router-1") for i in range(rows)])
        seq += rows
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    stored = await store.count()
    await store.close()
    n = batches * rows
    return {"rows": n, "stored": stored, "cpu_us_per_row": 1e6 * cpu / n, "wall_us_per_row": 1e6 * wall / n}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--batches", type=int, default=60)
    p.add_argument("--rows", type=int, default=50)
    p.add_argument("--label", default="")
    args = p.parse_args(argv)
    runs = [asyncio.run(one_run(args.batches, args.rows)) for _ in range(args.runs)]
    rep = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": platform.node(),
        "label": args.label,
        "args": {"runs": args.runs, "batches": args.batches, "rows": args.rows},
        "runs": runs,
        "median_cpu_us_per_row": statistics.median(r["cpu_us_per_row"] for r in runs),
    }
    label = args.label or "insert"
    print(f"{label}: {rep['median_cpu_us_per_row']:.1f} µs CPU a row (median of {args.runs})")
    if args.json:
        args.json.write_text(json.dumps(rep, indent=2))
    return rep


if __name__ == "__main__":
    main()
