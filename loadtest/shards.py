"""One run from several processes: a load generator that reads thousands of streamed tokens a second
in one asyncio loop falls behind, and then every latency it records grows with its own lag
(``summary.meta.client_loop_lag_ms``; on the H200 one process lagged 57 ms at p99 at 13,000 tok/s).

Every process builds the same seeded plan and takes every n-th planned request and closed-loop
worker (``Runner(shard=(i, n))``), on one clock: all start at the same wall-clock instant. The first
process also polls the replica count and reads fairlane's admin routes; the others only send. Their
records are merged, so the run's files and summary are those of one run. ``max_requests`` and
``max_in_flight`` are shared out.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from dataclasses import replace

from loadtest.records import RequestRecord
from loadtest.runner import Runner, RunResult
from loadtest.scenario import Scenario

SPAWN_LEAD_S = 5.0  # the children start Python and import httpx before the shared start


def run_in_shards(scenario: Scenario, url: str, **kwargs) -> RunResult:
    count = scenario.client_procs
    start_wall = time.time() + SPAWN_LEAD_S
    jobs = [(scenario, url, (i, count), start_wall) for i in range(1, count)]
    with multiprocessing.get_context("spawn").Pool(count - 1) as pool:
        others = pool.map_async(_shard_records, jobs)
        first = asyncio.run(Runner(scenario, url, shard=(0, count), start_wall=start_wall, **kwargs).run())
        records = [r for shard in others.get() for r in shard]
    merged = sorted([*first.records, *records], key=lambda r: (r.scheduled, r.tenant))
    return replace(first, records=merged)


def _shard_records(job: tuple[Scenario, str, tuple[int, int], float]) -> list[RequestRecord]:
    scenario, url, shard, start_wall = job
    runner = Runner(scenario, url, shard=shard, start_wall=start_wall, show_progress=False)
    return asyncio.run(runner.run()).records
