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
  over 30 days, written with COPY first.

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

from cluster.ledger.rows import Pricing, row_from_timing
from cluster.ledger.sla_query import ledger_report, ledger_sla
from cluster.ledger.spill import SpillFile
from cluster.ledger.store import PG_COLUMNS, LedgerStore
from cluster.ledger.time_range import TimeRange
from cluster.ledger.usage_query import usage_results, usage_rows
from cluster.ledger.writer import LedgerWriter
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


async def write_throughput(dsn: str, rows: int, spill: Path) -> dict[str, Any]:
    async with Database(dsn, f"fl_bench_write_{int(time.time())}") as db:
        store = LedgerStore(db)
        await store.migrate()
        writer = LedgerWriter(store, SpillFile(spill, "bench-write", 10_000_000))
        rng = random.Random(1)
        batch = [row_from_timing(timing(rng, time.monotonic()), "bench", "r1", PRICING) for _ in range(rows)]
        writer.migrated = True
        writer.start()
        began = time.perf_counter()
        cpu = time.process_time()
        for i, row in enumerate(batch):
            writer.put(row)
            if i % 500 == 499:
                await asyncio.sleep(0)  # as a router would: rows arrive between other work
        while writer.pending or writer.written < rows:
            await asyncio.sleep(0.01)
        took = time.perf_counter() - began
        stored = await store.count("bench")
        result = {
            "rows": rows,
            "stored": stored,
            "seconds": took,
            "rows_per_s": rows / took,
            "process_cpu_s": time.process_time() - cpu,
            "write_errors": writer.write_errors,
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
        writer = LedgerWriter(store, SpillFile(spill, "bench-loop", 10_000_000))
        writer.migrated = True
        writer.start()

        def sink(t: RequestTiming) -> None:
            writer.put(row_from_timing(t, "bench", "r1", PRICING))

        off = await probe_lateness(seconds, rate, None)
        on = await probe_lateness(seconds, rate, sink)
        await writer.flush(force=True)
        stored = await store.count("bench")
        await writer.close()
    return {
        "rate_per_s": rate,
        "seconds_each": seconds,
        "off": off,
        "on": on,
        "stored_rows": stored,
        "added_p99_ms": on["lateness_ms_p99"] - off["lateness_ms_p99"],
    }


def month_columns(n: int, start: float, seed: int) -> list[list]:
    """``n`` rows over 30 days from ``start``, as PG_COLUMNS' columns (numpy, then plain lists)."""
    rng = np.random.default_rng(seed)
    tenants = np.array([f"tenant-{i:02d}" for i in range(20)])
    classes = np.array(["interactive", "standard", "batch"])
    models = np.array(["llama-3.1-8b", "qwen2.5-7b"])
    tenant = rng.integers(0, 20, n)
    arrival = start + np.sort(rng.uniform(0, 30 * 86400, n))
    ok = rng.random(n) < 0.92
    ttft = rng.lognormal(-1.5, 0.8, n)
    out_tokens = rng.integers(1, 512, n)
    tpot = rng.lognormal(-3.5, 0.4, n)
    e2e = ttft + tpot * (out_tokens - 1)
    wait = rng.exponential(0.05, n)
    seconds = np.where(ok, e2e / 8, 0.0)
    data = {
        "request_id": [f"{seed:04x}{i:028x}" for i in range(n)],
        "app": ["fairlane"] * n,
        "router": ["router-0"] * n,
        "tenant_id": tenants[tenant].tolist(),
        "api_key_id": [f"key_{t:02d}" for t in tenant.tolist()],
        "model": models[rng.integers(0, 2, n)].tolist(),
        "sla_class": classes[tenant % 3].tolist(),
        "arrival": arrival.tolist(),
        "ended": (arrival + e2e).tolist(),
        "queue_wait_s": wait.tolist(),
        "ttft_s": np.where(ok, ttft, np.nan).tolist(),
        "tpot_s": np.where(ok, tpot, np.nan).tolist(),
        "itl_p99_s": np.where(ok, tpot * 3, np.nan).tolist(),
        "e2e_s": np.where(ok, e2e, np.nan).tolist(),
        "prompt_tokens": rng.integers(16, 2048, n).tolist(),
        "cached_tokens": [0] * n,
        "output_tokens": np.where(ok, out_tokens, 0).tolist(),
        "outcome": np.where(ok, "ok", "rejected").tolist(),
        "reason": [None] * n,
        "replica_seconds": seconds.tolist(),
        "cost_usd": (seconds * 5.0 / 3600).tolist(),
    }
    for name in ("ttft_s", "tpot_s", "itl_p99_s", "e2e_s"):
        data[name] = [None if v != v else v for v in data[name]]  # NaN -> NULL
    return [data[c] for c in PG_COLUMNS]


async def monthly_report(dsn: str, rows: int, chunk: int = 500_000) -> dict[str, Any]:
    async with Database(dsn, f"fl_bench_report_{int(time.time())}") as db:
        store = LedgerStore(db)
        await store.migrate()
        start = 1_764_547_200.0  # 2025-12-01 UTC
        conn = await asyncpg.connect(db)
        began = time.perf_counter()
        for i in range(0, rows, chunk):
            columns = month_columns(min(chunk, rows - i), start, seed=i // chunk)
            await conn.copy_records_to_table(
                "ledger_requests", records=zip(*columns, strict=True), columns=PG_COLUMNS
            )
        copy_s = time.perf_counter() - began
        await conn.execute("ANALYZE ledger_requests")
        size = await conn.fetchval("SELECT pg_total_relation_size('ledger_requests')")
        await conn.close()
        rng = TimeRange(start, start + 30 * 86400)
        config = default_tenancy_config()
        timings = await report_timings(store, config, rng)
        await store.close()
    return {
        "rows": rows,
        "copy_s": copy_s,
        "table_bytes": size,
        **timings,
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
        out["report"] = await monthly_report(args.dsn, args.report_rows)
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
    args = p.parse_args()
    args.parts = args.parts.split(",")
    result = asyncio.run(run(args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
