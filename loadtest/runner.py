"""Drive a scenario against a URL: open- and closed-loop tenants, bounded in count, connections and time."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from dataclasses import dataclass, field, replace

import httpx
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from cluster.telemetry.gc_pauses import PROCESS_GC, freeze_heap, thaw_heap
from cluster.telemetry.loop_lag import LoopLag
from loadtest.client import endpoint_path, monotonic_since, request_body, send
from loadtest.drain import cut_unended, drain_bound
from loadtest.plan import ClosedLoopSource, PlannedRequest, build_open_plan
from loadtest.records import CUT_ERROR, RequestRecord
from loadtest.replica_poller import ReplicaPoller
from loadtest.scenario import Scenario, TenantLoad


@dataclass
class RunResult:
    records: list[RequestRecord]
    started_wall: float
    elapsed_s: float
    replica_seconds: float
    replica_samples: list[tuple[float, int]]
    server: dict = field(default_factory=dict)
    # How late this process's own loop woke (ms): a saturated load generator inflates the latencies it
    # measures, so a run says whether it was one.
    client_loop_lag: dict = field(default_factory=dict)
    client_gc: dict = field(default_factory=dict)  # this process's collector pauses during the run
    # The drain after the load (``loadtest/drain.py``): its bound and parts, when the load stopped
    # (``load_end_s``) and how long the drain took (``waited_s``); this process's requests only.
    drain: dict = field(default_factory=dict)


SPAWN_LEAD_S = 5.0  # run_in_shards: the other processes start Python and import httpx first


class Runner:
    """Sends the scenario's requests; ``run`` returns when all have ended (the drain) or its bound hit."""

    def __init__(
        self,
        scenario: Scenario,
        url: str,
        *,
        replicas: int = 1,
        admin_key: str | None = None,
        show_progress: bool = True,
        shard: tuple[int, int] = (0, 1),
        start_wall: float | None = None,
    ) -> None:
        """``shard``: (index, count): this process sends every count-th planned request and closed-loop
        worker from ``index`` (``run_in_shards``); ``start_wall``: the shared start (wall clock)."""
        self.s = scenario
        self.url = url.rstrip("/")
        self.fallback_replicas = replicas
        self.admin_key = admin_key
        self.show_progress = show_progress
        self.records: list[RequestRecord] = []
        self._shard, self._shards = shard
        self._start_wall = start_wall
        self._budget = -(-scenario.max_requests // self._shards)
        self._sem = asyncio.Semaphore(max(1, scenario.max_in_flight // self._shards))
        self._loads = {t.id: t for t in scenario.tenants}
        self._clock = monotonic_since(time.monotonic())
        self._done = 0
        self._drain: dict = {}

    async def run(self) -> RunResult:
        limits = httpx.Limits(max_connections=self.s.max_in_flight, max_keepalive_connections=64)
        timeout = httpx.Timeout(self.s.request_timeout_s, connect=10.0)
        async with httpx.AsyncClient(base_url=self.url, timeout=timeout, limits=limits) as client:
            await self._admin(client, "POST", "/admin/timings/reset")
            poller = ReplicaPoller(client, self.fallback_replicas)
            # What exists now outlives the run: frozen, no full collection walks it during the run
            # (one took up to 235 ms of this process's loop on the H200); unfrozen after.
            freeze_heap()
            PROCESS_GC.install().reset()
            try:
                started_wall = self._start_wall or time.time()
                self._clock = monotonic_since(time.monotonic() + (started_wall - time.time()))
                await asyncio.sleep(max(0.0, -self._clock()))  # the shared start
                poller.start(self._clock)
                lag = LoopLag()
                lag.start()
                with self._progress() as progress:
                    await self._drive(client, progress)
                lag.stop()
                gc_pauses = PROCESS_GC.snapshot()
            finally:
                thaw_heap()
            elapsed = self._clock()
            await poller.stop(elapsed)
            state = await self._admin(client, "GET", "/admin/state")
            server = {
                "sla": await self._admin(client, "GET", "/admin/sla"),
                "timings": await self._admin(client, "GET", "/admin/timings"),
                "router_loop_lag": state.get("loop_lag") if isinstance(state, dict) else None,
                "router_gc": state.get("gc") if isinstance(state, dict) else None,
                "replica_gc": _replica_gc(state),
                "replica_profiles": state.get("replica_profiles") if isinstance(state, dict) else None,
            }
        records = sorted(self.records, key=lambda r: (r.scheduled, r.tenant))
        return RunResult(
            records,
            started_wall,
            elapsed,
            poller.replica_seconds,
            poller.samples,
            {k: v for k, v in server.items() if v is not None},
            lag.snapshot(),
            gc_pauses,
            self._drain,
        )

    async def _drive(self, client: httpx.AsyncClient, progress: Progress | None) -> None:
        """The load (arrivals until ``duration_s``), then the drain: every open request to its end."""
        tasks: set[asyncio.Task] = set()
        workers = [
            asyncio.create_task(
                self._closed_worker(
                    client, load, ClosedLoopSource(load, self.s.seed + w, self.s.sampling_of(load))
                )
            )
            for n, (load, w) in enumerate(
                (load, w) for load in self.s.tenants if load.concurrency for w in range(load.concurrency)
            )
            if n % self._shards == self._shard
        ]
        ticker = asyncio.create_task(self._tick(progress))
        try:
            await self._open_loop(client, tasks)
            if workers:  # closed-loop tenants send until the load's end
                await asyncio.sleep(max(0.0, self.s.duration_s - self._clock()))
            await self._drain_open({*workers, *tasks})
        finally:
            for t in (*workers, *tasks):
                t.cancel()  # only what the drain's bound left open: recorded as cut (``_one``)
            await asyncio.gather(*workers, *tasks, return_exceptions=True)
            cut_unended(self.records, self._clock())  # tasks cancelled before they ever ran
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker

    async def _drain_open(self, tasks: set[asyncio.Task]) -> None:
        """Wait until every request has ended (the condition, not a fixed time), within the bound."""
        load_end = self._clock()
        bound = drain_bound(self.records, self.s)
        pending = {t for t in tasks if not t.done()}
        if pending:
            await asyncio.wait(pending, timeout=bound.seconds)
        self._drain = bound.as_dict() | {"load_end_s": load_end, "waited_s": self._clock() - load_end}

    async def _open_loop(self, client: httpx.AsyncClient, tasks: set[asyncio.Task]) -> None:
        for n, planned in enumerate(build_open_plan(self.s)):
            if n % self._shards != self._shard:
                continue
            if self._budget <= 0:
                return
            delay = planned.at - self._clock()
            if delay > 0:
                await asyncio.sleep(delay)
            self._budget -= 1
            # The record exists before the task runs: the drain sees it open even if it never started.
            record = self._record(planned, planned.at or 0.0)
            tasks.add(asyncio.create_task(self._one(client, planned, record)))

    async def _closed_worker(
        self, client: httpx.AsyncClient, load: TenantLoad, source: ClosedLoopSource
    ) -> None:
        while self._clock() < self.s.duration_s and self._budget > 0:
            self._budget -= 1
            planned = source.next()
            await self._one(client, planned, self._record(planned, self._clock()))

    def _record(self, planned: PlannedRequest, scheduled: float) -> RequestRecord:
        """The request's record, appended at once so that one never sent is still reported (as cut)."""
        load = self._loads[planned.tenant]
        record = RequestRecord(
            request_id=f"{planned.tenant}-{len(self.records)}"
            + (f"-{self._shard}" if self._shards > 1 else ""),
            tenant=load.id,
            sla_class=load.sla_class,
            weight=load.weight,
            scheduled=scheduled,
            sent=scheduled,
            max_tokens=planned.max_tokens,
            warmup=scheduled < self.s.warmup_s,
        )
        self.records.append(record)
        return record

    async def _one(self, client: httpx.AsyncClient, planned: PlannedRequest, record: RequestRecord) -> None:
        load = self._loads[planned.tenant]
        body = request_body(
            self.s.endpoint, self.s.model, planned.prompt, planned.max_tokens, planned.sampling
        )
        headers = {"Authorization": f"Bearer {load.api_key}"}
        try:
            async with self._sem:
                await send(
                    client,
                    record,
                    endpoint_path(self.s.endpoint),
                    body,
                    headers,
                    self.s.request_timeout_s,
                    self._clock,
                )
        except asyncio.CancelledError:
            if record.end is None:  # cut while waiting for a connection slot
                record.status, record.error, record.end = "cut", CUT_ERROR, self._clock()
            raise
        finally:
            self._done += 1

    async def _tick(self, progress: Progress | None) -> None:
        if progress is None:
            return
        task = progress.add_task("load", total=self.s.duration_s, sent=0, done=0, failed=0)
        while True:
            failed = sum(1 for r in self.records if r.end is not None and not r.ok)
            progress.update(
                task,
                completed=min(self._clock(), self.s.duration_s),
                sent=len(self.records),
                done=self._done,
                failed=failed,
            )
            await asyncio.sleep(0.25)

    def _progress(self) -> contextlib.AbstractContextManager:
        if not self.show_progress:
            return contextlib.nullcontext()
        return Progress(
            TextColumn(f"[bold]{self.s.name}[/]"),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("sent {task.fields[sent]} · ended {task.fields[done]} · not ok {task.fields[failed]}"),
        )

    async def _admin(self, client: httpx.AsyncClient, method: str, path: str) -> dict | None:
        """fairlane's admin routes when an admin key is given; any failure means 'not available'."""
        if not self.admin_key:
            return None
        try:
            r = await client.request(
                method, path, headers={"Authorization": f"Bearer {self.admin_key}"}, timeout=30
            )
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None


def _replica_gc(state: dict | None) -> dict | None:
    """Each replica's collector pauses since its start (``/admin/state`` replica_loads), by id."""
    loads = state.get("replica_loads") if isinstance(state, dict) else None
    if not loads:
        return None
    return {rid: load["gc"] for rid, load in loads.items() if isinstance(load, dict) and "gc" in load}


def run_scenario(scenario: Scenario, url: str, **kwargs) -> RunResult:
    """The run, from ``scenario.client_procs`` processes when more than one (``run_in_shards``)."""
    if scenario.client_procs > 1:
        return run_in_shards(scenario, url, **kwargs)
    return asyncio.run(Runner(scenario, url, **kwargs).run())


def run_in_shards(scenario: Scenario, url: str, **kwargs) -> RunResult:
    """One run from several processes: a load generator that reads thousands of streamed tokens a
    second in one asyncio loop falls behind, and every latency it records grows with its own lag
    (``summary.meta.client_loop_lag_ms``; on the H200 one process lagged 57 ms at p99 at 13,000
    tok/s). Every process builds the same seeded plan and takes every n-th planned request and
    closed-loop worker, on one clock (a shared wall-clock start). The first also polls the replica
    count and reads fairlane's admin routes; the others only send. The records are merged into one
    run; ``max_requests`` and ``max_in_flight`` are shared out."""
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
