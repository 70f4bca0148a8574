"""The ledger's three figures on this machine (docs/ledger.md, BENCHMARKS.md):

    python -m bench.ledger_bench --dsn postgresql://postgres@127.0.0.1:5432/test --json docs/bench/F.json

* ``write``: rows per second one router's writer stores in PostgreSQL (default settings: batches
  every 200 ms or 500 rows), rows queued as fast as the request path can (``--rows``).
* ``loop``: what the ledger adds to a router's latency. A router is one event loop; everything
  the ledger does there (a row per request on the request path, the writer's batches) delays
  whatever else is ready. A probe sleeps 1 ms at a time and records how late it wakes, while
  requests end at ``--rate`` per second, with the ledger off (the records are only kept in
  memory) and on; p99 lateness on minus off is the latency the ledger adds to a request.
* ``report``: a monthly SLA report and daily usage buckets over ``--report-rows`` rows spread
  over 30 days. The server makes the rows (``generate_series``), their hours are marked dirty as the
  writer marks them, and the router's rollup job rolls them up; then the report, and the same report
  from the rows alone for comparison.

The write and loop parts run with the rollup maintained: the writer's inserts mark their hours, and
the rollup job runs beside it, rebuilding a closed hour of 100,000 rows meanwhile.

Each part uses a database of its own, created on the server and dropped after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import numpy as np
from sqlalchemy import text

from cluster.ledger.rollup_job import HOUR, roll_pending
from cluster.ledger.rows import Pricing, row_from_timing
from cluster.ledger.sla_query import ledger_report, ledger_sla
from cluster.ledger.spill import SpillLog
from cluster.ledger.store import COLUMNS, LedgerStore
from cluster.ledger.time_range import TimeRange
from cluster.ledger.usage_query import usage_results, usage_rows
from cluster.ledger.writer import LedgerWriter, WriterSettings
from cluster.telemetry.request_timing import RequestTiming, TimingRecorder
from tenancy import default_tenancy_config

PRICING = Pricing(5.0, 8)
TENANTS = (("alice", "interactive"), ("bob", "standard"), ("carol", "batch"))


class Database:
    """A database of its own on the server of ``dsn``."""

    def __init__(self, dsn: str, name: str) -> None:
        self.server, self.name = dsn, name
        self.dsn = urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))

    async def __aenter__(self) -> str:
        await self._admin(f"CREATE DATABASE {self.name}")
        return self.dsn

    async def __aexit__(self, *_: Any) -> None:
        await self._admin(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")

    async def _admin(self, statement: str) -> None:
        conn = await asyncpg.connect(self.server)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()


def timing(rng: random.Random, now: float) -> RequestTiming:
    tenant, sla = rng.choice(TENANTS)
    t = RequestTiming(uuid.uuid4().hex, tenant, sla, now - 2.0, prompt_tokens=128, model="m", key_id="key_x")
    t.admitted, t.dispatched, t.first_token, t.end = now - 1.99, now - 1.9, now - 1.6, now
    t.output_tokens, t.outcome, t.itl_p99 = 34, "ok", 0.02
    return t


class RollupAlongside:
    """The router's rollup job beside the writer, as a router runs it but every second: it rolls
    the closed hours, here one seeded with ``SEED_ROWS`` rows two hours back, so the database
    rebuilds an hour of that size while the writer writes (the open hour is never rolled)."""

    def __init__(self, store: LedgerStore, every_s: float = 1.0) -> None:
        self.store, self.every_s, self.rounds, self.hours = store, every_s, 0, 0
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        config = default_tenancy_config()
        while True:
            self.hours += await roll_pending(self.store, "bench", config)
            self.rounds += 1
            await asyncio.sleep(self.every_s)

    def __enter__(self) -> RollupAlongside:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *_: Any) -> None:
        if self._task is not None:
            self._task.cancel()

    def summary(self) -> dict[str, int]:
        return {"rollup_rounds": self.rounds, "rollup_hours_rolled": self.hours}


async def write_throughput(dsn: str, rows: int, spill: Path) -> dict[str, Any]:
    async with Database(dsn, f"fl_bench_write_{int(time.time())}") as db:
        store = LedgerStore(db)
        await store.migrate()
        await seed_closed_hour(db)
        # Every row queued at once, as before the hand-over queue had a bound: it holds them all.
        settings = WriterSettings(queue_rows=max(rows, WriterSettings().queue_rows))
        writer = LedgerWriter(LedgerStore(db), SpillLog(spill, "bench-write", 10_000_000), settings)
        rng = random.Random(1)
        batch = [row_from_timing(timing(rng, time.monotonic()), "bench", "r1", PRICING) for _ in range(rows)]
        writer.migrated = True
        writer.start()
        began = time.perf_counter()
        cpu = time.process_time()
        with RollupAlongside(store) as job:
            for i, row in enumerate(batch):
                writer.put(row)
                if i % 500 == 499:
                    await asyncio.sleep(0)  # as a router would: rows arrive between other work
            while (writer.pending_rows or writer.written < rows) and not writer.queue_dropped:
                await asyncio.sleep(0.01)  # a dropped row would never be written: stop and say so
            took = time.perf_counter() - began
        stored = await store.count("bench") - SEED_ROWS
        result = job.summary() | {
            "rows": rows,
            "stored": stored,
            "seconds": took,
            "rows_per_s": rows / took,
            "process_cpu_s": time.process_time() - cpu,
            "write_errors": writer.write_errors,
            "queue_dropped": writer.queue_dropped,
        }
        await writer.close()
        return result


async def probe_lateness(seconds: float, rate: float, sink) -> dict[str, float]:
    """Requests end at ``rate``/s (each through ``recorder.add``) while a probe measures loop lag."""
    recorder = TimingRecorder(50_000)
    recorder.sink = sink
    lateness: list[float] = []
    stop = time.monotonic() + seconds
    rng = random.Random(2)
    add_ns: list[int] = []

    async def requests() -> None:
        period, per_tick = 0.01, max(1, round(rate * 0.01))
        next_at = time.monotonic()
        while time.monotonic() < stop:
            for _ in range(per_tick):
                t = timing(rng, time.monotonic())
                began = time.perf_counter_ns()
                recorder.add(t)  # what ActiveRequest.close does at a request's end
                add_ns.append(time.perf_counter_ns() - began)
            next_at += period
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def probe() -> None:
        while time.monotonic() < stop:
            began = time.perf_counter()
            await asyncio.sleep(0.001)
            lateness.append(time.perf_counter() - began - 0.001)

    await asyncio.gather(requests(), probe())
    lat = np.array(lateness) * 1000
    add = np.array(add_ns) / 1000
    return {
        "probes": len(lat),
        "lateness_ms_p50": float(np.percentile(lat, 50)),
        "lateness_ms_p99": float(np.percentile(lat, 99)),
        "lateness_ms_max": float(lat.max()),
        "end_of_request_us_p50": float(np.percentile(add, 50)),
        "end_of_request_us_p99": float(np.percentile(add, 99)),
        "requests": len(add),
    }


async def loop_latency(dsn: str, seconds: float, rate: float, spill: Path) -> dict[str, Any]:
    async with Database(dsn, f"fl_bench_loop_{int(time.time())}") as db:
        store = LedgerStore(db)
        await store.migrate()
        await seed_closed_hour(db)
        writer = LedgerWriter(LedgerStore(db), SpillLog(spill, "bench-loop", 10_000_000))  # its own thread
        writer.migrated = True
        writer.start()

        def sink(t: RequestTiming) -> None:
            writer.put(row_from_timing(t, "bench", "r1", PRICING))

        off = await probe_lateness(seconds, rate, None)
        with RollupAlongside(store) as job:
            on = await probe_lateness(seconds, rate, sink)
        await writer.flush(force=True)
        stored = await store.count("bench") - SEED_ROWS
        await writer.close()
    return {
        "rate_per_s": rate,
        "seconds_each": seconds,
        "off": off,
        "on": on,
        "stored_rows": stored,
        "added_p99_ms": on["lateness_ms_p99"] - off["lateness_ms_p99"],
        **job.summary(),
    }


SEED_ROWS = 100_000


async def seed_closed_hour(db: str, rows: int = SEED_ROWS) -> None:
    """``rows`` rows of app "bench" in the hour two hours back, marked as the writer marks them."""
    hour = (int(time.time()) // HOUR - 2) * HOUR
    conn = await asyncpg.connect(db)
    try:
        await conn.execute(month_sql(0, rows, rows, hour, HOUR, app="bench"))
        await conn.execute(MARK_SQL)
    finally:
        await conn.close()


def month_sql(lo: int, hi: int, n: int, start: float, span: float = 30 * 86400, app: str = "fairlane") -> str:
    """Rows ``lo``..``hi`` of ``n`` spread over ``span`` seconds from ``start``, made by the server: 20
    tenants (one key each, classes in turn), two models, 92 % ok, TTFT and TPOT log-normal
    (Box-Muller), E2E = TTFT + TPOT × (tokens − 1), queue wait exponential."""
    cols = ", ".join(COLUMNS)
    return f"""
    INSERT INTO ledger_requests ({cols})
    SELECT lpad(to_hex(i), 32, '0'), '{app}', 'router-0', 'tenant-' || lpad(t::text, 2, '0'),
        'key_' || lpad(t::text, 2, '0'), CASE WHEN m < 0.5 THEN 'llama-3.1-8b' ELSE 'qwen2.5-7b' END,
        (ARRAY['interactive', 'standard', 'batch'])[t % 3 + 1], arrival, arrival + e2e, wait,
        CASE WHEN ok THEN ttft END, CASE WHEN ok THEN tpot END, CASE WHEN ok THEN tpot * 3 END,
        CASE WHEN ok THEN e2e END, prompt, 0, CASE WHEN ok THEN out_tokens ELSE 0 END,
        CASE WHEN ok THEN 'ok' ELSE 'rejected' END, NULL, CASE WHEN ok THEN e2e / 8 ELSE 0 END,
        CASE WHEN ok THEN e2e / 8 * 5.0 / 3600 ELSE 0 END
    FROM (SELECT *, ttft + tpot * (out_tokens - 1) AS e2e FROM (
        SELECT i, floor(random() * 20)::int AS t, random() AS m, random() < 0.92 AS ok,
            {start!r} + (i + random()) * {span!r} / {n}::float8 AS arrival,
            exp(-1.5 + 0.8 * sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random())) AS ttft,
            exp(-3.5 + 0.4 * sqrt(-2 * ln(1 - random())) * cos(2 * pi() * random())) AS tpot,
            1 + floor(random() * 511)::int AS out_tokens, 16 + floor(random() * 2032)::bigint AS prompt,
            -0.05 * ln(1 - random()) AS wait
        FROM generate_series({lo}, {hi - 1}) AS i) AS drawn) AS rows
    """


# What the writer's insert marks (store.PG_MERGE), for rows stored another way (the load above).
MARK_SQL = f"""
    INSERT INTO ledger_rollup_dirty (app, hour, router, version, marked_at)
    SELECT DISTINCT app, CAST(floor(arrival / {HOUR}) * {HOUR} AS BIGINT), router, 1, 0.0
    FROM ledger_requests ON CONFLICT DO NOTHING
"""


async def load_month(db: str, rows: int, start: float, chunk: int = 1_000_000) -> dict[str, Any]:
    conn = await asyncpg.connect(db)
    try:
        began = time.perf_counter()
        for lo in range(0, rows, chunk):
            await conn.execute(month_sql(lo, min(rows, lo + chunk), rows, start))
        load_s = time.perf_counter() - began
        await conn.execute(MARK_SQL)
        await conn.execute("VACUUM ANALYZE ledger_requests")
        size = await conn.fetchval("SELECT pg_total_relation_size('ledger_requests')")
    finally:
        await conn.close()
    return {"load_s": load_s, "table_bytes": size}


async def roll_month(store: LedgerStore, config) -> dict[str, Any]:
    """The router's job (rollup_job.roll_pending), rounds of 24 hours until no closed hour waits."""
    began, hours = time.perf_counter(), 0
    while rolled := await roll_pending(store, "fairlane", config, limit=24):
        hours += rolled
    out: dict[str, Any] = {"rollup_s": time.perf_counter() - began, "rollup_hours": hours}
    async with store.connect() as conn:
        for table in ("ledger_rollup", "ledger_rollup_latency"):
            out[f"{table}_rows"] = (await conn.execute(text(f"SELECT count(*) FROM {table}"))).scalar()
            size = await conn.execute(text(f"SELECT pg_total_relation_size('{table}')"))
            out[f"{table}_bytes"] = size.scalar()
    return out


async def monthly_report(dsn: str, rows: int, compare_raw: bool) -> dict[str, Any]:
    async with Database(dsn, f"fl_bench_report_{int(time.time())}") as db:
        store = LedgerStore(db)
        await store.migrate()
        start = 1_764_547_200.0  # 2025-12-01 UTC
        loaded = await load_month(db, rows, start)
        print("loaded", json.dumps(loaded), flush=True)
        config = default_tenancy_config()
        rolled = await roll_month(store, config)
        print("rolled", json.dumps(rolled), flush=True)
        rng = TimeRange(start, start + 30 * 86400)
        timings = await report_timings(store, config, rng)
        if compare_raw:
            timings["raw_rows_only"] = await raw_comparison(store, config, rng)
        await store.close()
    return {"rows": rows, **loaded, **rolled, **timings}


async def raw_comparison(store: LedgerStore, config, rng: TimeRange) -> dict[str, Any]:
    """The same report from the rows alone (the rollup unused): its time, and how far the two are
    apart (counts, tokens and cost exactly alike; percentiles within the bins' bound)."""
    began = time.perf_counter()
    raw = await ledger_report(store, config, rng, app="fairlane", width=86400, use_rollup=False)
    took = time.perf_counter() - began
    rolled = await ledger_report(store, config, rng, app="fairlane", width=86400)
    worst, same = 0.0, True
    for a, b in zip(raw.sla.tenants + raw.sla.classes, rolled.sla.tenants + rolled.sla.classes, strict=True):
        same &= (a.requests, a.ok, a.rejected, a.output_tokens, a.sla_attainment) == (
            b.requests,
            b.ok,
            b.rejected,
            b.output_tokens,
            b.sla_attainment,
        )
        for metric in ("ttft_s", "tpot_s", "e2e_s"):
            for p, value in getattr(a, metric).items():
                if value:
                    worst = max(worst, abs(getattr(b, metric)[p] / value - 1))
    return {
        "report_and_usage_s": took,
        "percentiles": raw.percentiles,
        "counts_equal": same,
        "cost_rel_diff": abs(raw.sla.gpu_dollars / rolled.sla.gpu_dollars - 1),
        "worst_percentile_rel_diff": worst,
    }


async def report_timings(store: LedgerStore, config, rng: TimeRange) -> dict[str, Any]:
    """The month as ``fairlane report`` reads it (SLA and daily usage together), then as
    /admin/sla and /admin/usage each read it alone."""
    began = time.perf_counter()
    both = await ledger_report(store, config, rng, app="fairlane", width=86400)
    results, outcomes = usage_results(both.sums, 86400)
    out: dict[str, Any] = {"report_and_usage_s": time.perf_counter() - began}
    began = time.perf_counter()
    await ledger_sla(store, config, rng, app="fairlane")
    out["sla_alone_s"] = time.perf_counter() - began
    began = time.perf_counter()
    await usage_rows(store, rng, 86400, config, app="fairlane")
    out["usage_alone_s"] = time.perf_counter() - began
    return out | {
        "report_requests": sum(t.requests for t in both.sla.tenants),
        "report_ok": sum(t.ok for t in both.sla.tenants),
        "percentiles": both.percentiles,
        "usage_buckets": len({r.start_time for r in results}),
        "usage_results": len(results),
        "usage_requests": sum(outcomes.values()),
    }


def git_commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    spill = Path(args.spill_dir)
    out: dict[str, Any] = {"commit": git_commit(), "date": time.strftime("%Y-%m-%d"), "args": vars(args)}
    if "write" in args.parts:
        out["write"] = await write_throughput(args.dsn, args.rows, spill)
        print("write", json.dumps(out["write"]))
    if "loop" in args.parts:
        out["loop"] = await loop_latency(args.dsn, args.seconds, args.rate, spill)
        print("loop", json.dumps(out["loop"]))
    if "report" in args.parts:
        out["report"] = await monthly_report(args.dsn, args.report_rows, not args.no_compare_raw)
        print("report", json.dumps(out["report"]))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--dsn", default="postgresql://postgres@127.0.0.1:5432/test", help="A server to create databases on."
    )
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--parts", default="write,loop,report", help="Comma-separated: write, loop, report.")
    p.add_argument("--rows", type=int, default=100_000, help="Rows of the write part.")
    p.add_argument("--rate", type=float, default=1000.0, help="Requests ending per second in the loop part.")
    p.add_argument("--seconds", type=float, default=15.0, help="Seconds of each side of the loop part.")
    p.add_argument("--report-rows", type=int, default=10_000_000, help="Rows of the report part.")
    p.add_argument("--spill-dir", default="/tmp/fairlane-ledger-bench-spill")
    p.add_argument("--no-compare-raw", action="store_true", help="Skip the report from the rows alone.")
    args = p.parse_args()
    args.parts = args.parts.split(",")
    result = asyncio.run(run(args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
