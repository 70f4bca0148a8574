"""The soak: a long mixed run with the faults interleaved, then the books.

Sampled and greedy requests of mixed lengths stream from every tenant the whole time; every
``cycle_s`` one fault from the rotation strikes: a disconnect storm, an overload burst, a replica
kill (Serve replaces it), a Redis restart. It ends after ``duration_s`` or ``max_requests``; then
the load stops, the cluster settles, and the report says:

* lost: requests that ended without an answer of any kind (no status, no error body, no event);
* hung: requests that ran into the client's own timeout, or had not ended when the load stopped;
* the accounting, client against server (``DrillReport.balanced``);
* memory: each router's and the replicas' resident memory, mean of the first window (after the
  first cycle) against the mean of the last, as a fraction of change;
* what the routers and replicas hold after the run against before it: leases, queue, waiters,
  tracked ids, in flight, KV blocks in use.

Like every drill it kills nothing itself: the replica kill and the Redis stop/start are callables.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

from cluster.ops.chaos_client import ClientRecord, fill_record
from cluster.ops.chaos_drills import DrillReport, Fault, Target, _counted, _report, admin_state

HANG_CODES = {"ReadTimeout", "WriteTimeout", "PoolTimeout", "ConnectTimeout", "not_ended"}
LOST_CODES = {"RemoteProtocolError", "ReadError", "ConnectError", "stream_ended_without_done"}
PROMPTS = (
    "Count from one to two hundred in words, separated by commas.",
    "Write a short story about a lighthouse keeper.",
    "List the planets of the solar system with one fact each.",
    "Explain what a hash map is to a child.",
)


@dataclass(frozen=True)
class SoakFaults:
    """The faults an operator can give (None: that fault is left out of the rotation)."""

    kill_replica: Fault | None = None
    replica_recovered: Callable[[], Awaitable[bool]] | None = None
    stop_redis: Fault | None = None
    start_redis: Fault | None = None


@dataclass(frozen=True)
class SoakPlan:
    duration_s: float = 1800.0
    max_requests: int = 200_000
    cycle_s: float = 60.0
    per_tenant: int = 2  # steady streaming workers per tenant
    storm_clients: int = 40
    burst_rate: float = 20.0  # requests per second of an overload burst
    burst_s: float = 5.0
    redis_down_s: float = 5.0
    sample_s: float = 5.0
    window_s: float = 600.0  # memory windows: the first (after one cycle) and the last
    seed: int = 11


def random_body(target: Target, rng: random.Random) -> dict:
    """A request like the API's traffic: mostly sampled (temperature 1 is the default), some greedy."""
    body = target.body(rng.randint(4, 48), rng.choice(PROMPTS))
    temperature = rng.choice((0.0, 0.7, 1.0, 1.0))
    return body | {"temperature": temperature, "seed": rng.randrange(2**31)}


class Soak:
    def __init__(self, target: Target, faults: SoakFaults, plan: SoakPlan) -> None:
        self.target, self.faults, self.plan = target, faults, plan
        self.rng = random.Random(plan.seed)
        self.records: list[ClientRecord] = []
        self.tasks: set[asyncio.Task] = set()
        self.samples: list[dict] = []
        self.faults_done: list[dict] = []
        self.stop = asyncio.Event()

    def full(self) -> bool:
        return self.stop.is_set() or len(self.records) >= self.plan.max_requests

    def record(self) -> tuple[ClientRecord, str, dict]:
        tenant, key = self.rng.choice(list(self.target.keys.items()))
        rec = ClientRecord(tenant, ending="errored", code="not_ended")  # until it ends
        self.records.append(rec)
        return rec, key, random_body(self.target, self.rng)

    def send(self, client: httpx.AsyncClient, drop_after: int | None = None) -> None:
        """A request on its own task (storms and bursts), awaited at the end of the run."""
        rec, key, body = self.record()
        task = asyncio.create_task(fill_record(rec, client, key, body, drop_after))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def steady_worker(self, client: httpx.AsyncClient) -> None:
        while not self.full():
            rec, key, body = self.record()
            await fill_record(rec, client, key, body, None)
            if rec.ending == "rejected":
                await asyncio.sleep(0.2)  # a polite client backs off on 429

    async def storm(self, client: httpx.AsyncClient) -> dict:
        for _ in range(self.plan.storm_clients):
            self.send(client, drop_after=self.rng.randint(0, 12))
            await asyncio.sleep(self.rng.uniform(0, 0.05))
        return {}

    async def burst(self, client: httpx.AsyncClient) -> dict:
        for _ in range(int(self.plan.burst_rate * self.plan.burst_s)):
            if self.full():
                break
            self.send(client)
            await asyncio.sleep(1.0 / self.plan.burst_rate)
        return {}

    async def kill(self, client: httpx.AsyncClient) -> dict:
        killed = time.monotonic()
        await self.faults.kill_replica()  # type: ignore[misc]
        await asyncio.sleep(1.0)
        while not await self.faults.replica_recovered() and time.monotonic() - killed < 180:  # type: ignore[misc]
            await asyncio.sleep(0.5)
        return {"recover_s": round(time.monotonic() - killed, 1)}

    async def redis_restart(self, client: httpx.AsyncClient) -> dict:
        await self.faults.stop_redis()  # type: ignore[misc]
        await asyncio.sleep(self.plan.redis_down_s)
        await self.faults.start_redis()  # type: ignore[misc]
        return {"down_s": self.plan.redis_down_s}

    def rotation(self) -> list[tuple[str, Callable[[httpx.AsyncClient], Awaitable[dict]]]]:
        kinds: list[tuple[str, Callable[[httpx.AsyncClient], Awaitable[dict]]]] = [
            ("storm", self.storm),
            ("burst", self.burst),
        ]
        if self.faults.stop_redis and self.faults.start_redis:
            kinds.append(("redis_restart", self.redis_restart))
        if self.faults.kill_replica and self.faults.replica_recovered:
            kinds.append(("replica_kill", self.kill))  # last: its recovery is the longest fault
        return kinds

    async def fault_loop(self, client: httpx.AsyncClient, started: float) -> None:
        rotation, i = self.rotation(), 0
        while not self.full():
            await asyncio.sleep(self.plan.cycle_s)
            if self.full() or time.monotonic() - started >= self.plan.duration_s:
                break
            name, fault = rotation[i % len(rotation)]
            at = time.monotonic() - started
            self.faults_done.append({"fault": name, "at_s": round(at, 1), **await fault(client)})
            i += 1

    async def sampler(self, client: httpx.AsyncClient, started: float) -> None:
        while not self.full():
            try:
                state = await admin_state(client, self.target)
                loads = state.get("replica_loads", {}).values()
                self.samples.append(
                    {
                        "t": time.monotonic() - started,
                        "router": state.get("router"),
                        "router_rss": state.get("rss_bytes", 0),
                        "replica_rss": [v.get("rss_bytes", 0) for v in loads],
                    }
                )
            except (httpx.HTTPError, ValueError):
                pass  # a sample lost to a fault; the next one comes
            await asyncio.sleep(self.plan.sample_s)

    async def run(self, client: httpx.AsyncClient) -> list[ClientRecord]:
        started = time.monotonic()
        workers = [self.steady_worker(client) for _ in self.target.keys for _ in range(self.plan.per_tenant)]
        background = asyncio.gather(self.fault_loop(client, started), self.sampler(client, started), *workers)
        while time.monotonic() - started < self.plan.duration_s and not self.full():
            await asyncio.sleep(1.0)
        self.stop.set()
        await background
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=180)
        return self.records


async def holdings(client: httpx.AsyncClient, target: Target) -> dict:
    """What one router and the replicas it sees hold now (a leak check)."""
    s = await admin_state(client, target)
    return {
        "in_flight": s["in_flight"],
        "queued": s["queued"],
        "waiters": s.get("waiters", 0),
        "leases": sum(s.get("active_leases", {}).values()),
        # Each replica's own report (cluster/serving/replica_board.py), not the router's poll of one.
        "kv_blocks_used": sum(v.get("kv_blocks_used", 0) for v in s.get("replica_loads", {}).values()),
        "replicas_reporting": len(s.get("replica_loads", {})),
    }


async def holdings_settled(
    client: httpx.AsyncClient, target: Target, baseline: dict, wait_s: float = 15.0
) -> dict:
    """``holdings`` once back at ``baseline``, or the last reading after ``wait_s``: the replicas'
    loads reach the router by polling (one replica per poll), so a reading can be a poll behind."""
    deadline = time.monotonic() + wait_s
    while True:
        now = await holdings(client, target)
        if now == baseline or time.monotonic() > deadline:
            return now
        await asyncio.sleep(0.5)


def memory_change(samples: list[dict], plan: SoakPlan, total_s: float) -> dict:
    """Mean RSS in the first window (after one cycle) and the last, per router and for the replicas."""
    window = min(plan.window_s, max(total_s - plan.cycle_s, 1.0) / 2)
    first = [s for s in samples if plan.cycle_s <= s["t"] < plan.cycle_s + window]
    last = [s for s in samples if s["t"] >= total_s - window]
    out: dict[str, float] = {"window_s": round(window, 1)}

    def mean(values: list[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    for router in sorted({s["router"] for s in samples if s["router"]}):
        a = mean([s["router_rss"] for s in first if s["router"] == router])
        b = mean([s["router_rss"] for s in last if s["router"] == router])
        out[f"router_{router}_change"] = round(b / a - 1, 4) if a else float("nan")
    a = mean([mean(s["replica_rss"]) for s in first if s["replica_rss"]])
    b = mean([mean(s["replica_rss"]) for s in last if s["replica_rss"]])
    out["replicas_change"] = round(b / a - 1, 4) if a else float("nan")
    out["replicas_first_mb"], out["replicas_last_mb"] = round(a / 2**20, 1), round(b / 2**20, 1)
    return out


async def soak(target: Target, faults: SoakFaults, plan: SoakPlan) -> DrillReport:
    runner = Soak(target, faults, plan)
    started = time.monotonic()
    async with target.client(timeout_s=120.0) as client:
        before = await holdings(client, target)
        records, server = await _counted(client, target, lambda: runner.run(client))
        after = await holdings_settled(client, target, before)
    total_s = time.monotonic() - started
    codes = [r.code for r in records if r.ending == "errored"]
    figures = {
        "duration_s": round(total_s, 1),
        "lost": sum(c in LOST_CODES for c in codes),
        "hung": sum(c in HANG_CODES for c in codes),
        "errored_codes": str(dict(Counter(codes))),
        "faults": len(runner.faults_done),
        **{f"before_{k}": v for k, v in before.items()},
        **{f"after_{k}": v for k, v in after.items()},
        **memory_change(runner.samples, plan, total_s),
    }
    report = _report("soak", records, server, **figures)
    report.figures["fault_log"] = str(runner.faults_done)
    return report


def targets_met(report: DrillReport, rss_tolerance: float = 0.05) -> list[str]:
    """The soak's targets that the report misses (empty: all met)."""
    f = report.figures
    missed = []
    if f["lost"] or f["hung"]:
        missed.append(f"lost {f['lost']}, hung {f['hung']}")
    if not report.balanced:
        missed.append("client and server books differ")
    held = [k[len("after_") :] for k in f if k.startswith("after_") and f[k] != f[f"before_{k[6:]}"]]
    if held:
        missed.append("not back at baseline: " + ", ".join(held))
    for k, v in f.items():
        if k.endswith("_change") and isinstance(v, float) and not abs(v) <= rss_tolerance:  # NaN: no data
            missed.append(f"{k} {v:+.1%}")
    return missed
