"""Fault drills against a running cluster, over HTTP: overload, disconnect storm, replica crash and
Redis outage. ``fairlane chaos`` runs them on an operator's deployment; ``tests/faults`` runs the
same code (shorter) and asserts on the reports.

A drill never kills anything itself: the crash and outage drills take the fault as a callable, so
the same drill runs with ``ray.kill`` in tests and with an operator's own command in production.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from cluster.ops.chaos_client import ENDINGS, ClientRecord, counter_delta, fill_record, server_counters, tally

Fault = Callable[[], Awaitable[object]]
COUNTS_WAIT_S = 60.0  # the longest wait for the routers to count every ending of a drill
COUNT_PROMPT = "Count from one to two hundred in words, separated by commas."


@dataclass(frozen=True)
class Target:
    """A cluster to drill: base URL, tenant keys, the admin key and the served model."""

    base_url: str
    keys: dict[str, str]
    admin_key: str
    model: str = "smollm2-135m"
    routers: int = 1

    def client(self, timeout_s: float = 120.0) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=400, max_keepalive_connections=50)
        return httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s, limits=limits)

    def body(self, max_tokens: int, prompt: str = COUNT_PROMPT) -> dict:
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }


@dataclass
class DrillReport:
    """Client-side and server-side accounting of one drill, plus its figures."""

    name: str
    client: dict[str, int] = field(default_factory=dict)
    server: dict[str, int] = field(default_factory=dict)
    figures: dict[str, float | int | str] = field(default_factory=dict)
    records: list[ClientRecord] = field(default_factory=list, repr=False)

    @property
    def balanced(self) -> bool:
        """Every request ended exactly once on each side, and the sides differ only where they must.

        The router records an ending before the client can see it (a 429 is counted before it is
        returned, a stream's ``ok`` in the event-loop step that hands ``[DONE]`` to Serve), and it
        records ``aborted`` only for a client that left. The one difference left is inherent: a
        client that gives up while the router's answer is on its way (a timer firing as the 429
        travels back) counts "aborted" where the router counted that answer, and no server can
        know whether an answer was read. So the totals are equal, every server abort is a client
        abort, every other client ending is matched by the server, and a refusal the client missed
        belongs to a client that left before its stream started (a 429 never follows a 200).
        With no client aborts this is exact equality.
        """
        c, s = self.client, self.server
        if not c["sent"] == sum(c[e] for e in ENDINGS) == sum(s.get(e, 0) for e in ENDINGS):
            return False
        missed = {e: s.get(e, 0) - c[e] for e in ENDINGS if e != "aborted"}
        left_unstreamed = sum(r.ending == "aborted" and r.status != 200 for r in self.records)
        return min(missed.values()) >= 0 and missed["rejected"] <= left_unstreamed

    @property
    def left_as_answered(self) -> int:
        """Client aborts the server ended otherwise: clients that left as the answer was on its way."""
        return self.client["aborted"] - self.server.get("aborted", 0)

    def to_dict(self) -> dict:
        return {"name": self.name, "client": self.client, "server": self.server, "figures": self.figures}


async def admin_state(client: httpx.AsyncClient, target: Target) -> dict:
    resp = await client.get("/admin/state", headers={"Authorization": f"Bearer {target.admin_key}"})
    return resp.json()


async def settled(client: httpx.AsyncClient, target: Target, timeout_s: float = 60.0) -> dict:
    """Wait until every router holds nothing (queue, in flight, waiters, leases); one router's state."""
    deadline = time.monotonic() + timeout_s
    idle_routers: set[str] = set()
    while True:
        state = await admin_state(client, target)
        idle = state["in_flight"] == 0 and state["queued"] == 0 and state.get("waiters", 0) == 0
        if idle and not any(state.get("active_leases", {}).values()):
            idle_routers.add(state.get("router", "?"))
        else:
            idle_routers.discard(state.get("router", "?"))
        if len(idle_routers) >= target.routers or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.1)


async def _counted(client: httpx.AsyncClient, target: Target, run: Callable[[], Awaitable[list]]) -> tuple:
    """Run ``run`` between two readings of the server's counters; (records, server delta)."""
    before = await server_counters(client, target.routers, target.admin_key)
    records = list(await run())
    await settled(client, target)
    # A router records an abort when Serve cancels its handler, a moment after the client left (on
    # a loaded box, many moments: the wait ends as soon as the counts are in).
    started = time.monotonic()
    while True:
        delta = counter_delta(before, await server_counters(client, target.routers, target.admin_key))
        waited = time.monotonic() - started
        if delta["sent"] >= len(records) or waited > COUNTS_WAIT_S:
            delta["counted_after_s"] = round(waited, 1)
            return records, delta
        await asyncio.sleep(0.5)


def _report(name: str, records: list[ClientRecord], server: dict, **figures) -> DrillReport:
    return DrillReport(name, tally(records), server, figures, records)


def _counts(names) -> str:
    """``name:count`` pairs, sorted by name (a figure that stays a string in the report's JSON)."""
    return ",".join(f"{name}:{n}" for name, n in sorted(Counter(names).items()))


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---- overload ---------------------------------------------------------------------------------
async def measure_capacity(
    client: httpx.AsyncClient, target: Target, requests: int, max_tokens: int
) -> float:
    """Completed requests per second with the room kept full (closed loop, 4 at a time)."""
    keys = list(target.keys.items())
    started = time.monotonic()
    sem = asyncio.Semaphore(4)

    async def one(i: int) -> ClientRecord:
        tenant, key = keys[i % len(keys)]
        async with sem:
            return await fill_record(ClientRecord(tenant), client, key, target.body(max_tokens), None)

    done = await asyncio.gather(*(one(i) for i in range(requests)))
    ok = sum(r.ending == "completed" for r in done)
    return max(ok, 1) / (time.monotonic() - started)


async def _open_loop(
    client: httpx.AsyncClient, target: Target, rate: float, duration_s: float, max_tokens: int
) -> list[ClientRecord]:
    keys = list(target.keys.items())
    tasks = []
    for i in range(int(rate * duration_s)):
        tenant, key = keys[i % len(keys)]
        rec = ClientRecord(tenant)
        tasks.append(asyncio.create_task(fill_record(rec, client, key, target.body(max_tokens), None)))
        await asyncio.sleep(1.0 / rate)
    return list(await asyncio.gather(*tasks))


async def overload(
    target: Target,
    factor: float = 5.0,
    phase_s: float = 8.0,
    max_tokens: int = 8,
    probe_requests: int = 12,
    min_per_phase: int = 0,
) -> DrillReport:
    """Two equal phases at ``factor`` × measured capacity: fast 429s beyond the bounded queues, every
    accepted request finishes, and the router's memory after phase 2 is compared with phase 1.

    ``min_per_phase``: send at least this many requests per phase. A slow box measures a low
    capacity, and ``factor`` times it may then not reach the queue bounds within a phase."""
    async with target.client() as client:
        capacity = await measure_capacity(client, target, probe_requests, max_tokens)
        rate = max(factor * capacity, min_per_phase / phase_s)
        rss: list[int] = []

        async def phases() -> list[ClientRecord]:
            out: list[ClientRecord] = []
            for _ in range(2):
                out += await _open_loop(client, target, rate, phase_s, max_tokens)
                rss.append((await settled(client, target))["rss_bytes"])
            return out

        records, server = await _counted(client, target, phases)
    rejected = [r for r in records if r.ending == "rejected"]
    return _report(
        "overload",
        records,
        server,
        capacity_rps=round(capacity, 2),
        offered_rps=round(rate, 2),
        reject_p99_s=round(_pct([r.latency for r in rejected], 0.99), 3),
        rejects_with_retry_after=sum(r.retry_after is not None for r in rejected),
        # which bound refused them: the queue's per-tenant and total lengths, or the expected wait
        rejected_codes=_counts(r.code or "?" for r in rejected),
        rss_phase1_mb=round(rss[0] / 2**20, 1),
        rss_phase2_mb=round(rss[1] / 2**20, 1),
    )


# ---- disconnect storm -------------------------------------------------------------------------
async def disconnect_storm(
    target: Target, clients: int = 100, max_tokens: int = 160, seed: int = 7, spread_s: float = 2.0
) -> DrillReport:
    """``clients`` streams that drop at random points: while waiting (a timer) or after k tokens."""
    rng = random.Random(seed)
    keys = list(target.keys.items())

    async def one(i: int) -> ClientRecord:
        tenant, key = keys[i % len(keys)]
        await asyncio.sleep(rng.uniform(0, spread_s))
        rec = ClientRecord(tenant, ending="aborted")
        drop_tokens = rng.randint(1, 24) if i % 2 == 0 else None
        task = fill_record(rec, client, key, target.body(max_tokens), drop_tokens)
        if drop_tokens is not None:
            return await task
        try:  # a timer: the request may still wait in the queue or already stream when it fires
            return await asyncio.wait_for(task, timeout=rng.uniform(1.0, 5.0))
        except TimeoutError:
            rec.ending, rec.ended = "aborted", time.monotonic()
            return rec

    async with target.client() as client:
        records, server = await _counted(
            client, target, lambda: asyncio.gather(*(one(i) for i in range(clients)))
        )
        state = await settled(client, target)
    return _report(
        "disconnect_storm",
        list(records),
        server,
        in_flight_after=state["in_flight"],
        queued_after=state["queued"],
        leases_after=sum(state.get("active_leases", {}).values()),
    )


# ---- steady load with a fault in the middle ---------------------------------------------------
async def _steady(
    client: httpx.AsyncClient, target: Target, per_tenant: int, max_tokens: int, stop: asyncio.Event
) -> list[ClientRecord]:
    records: list[ClientRecord] = []

    async def worker(tenant: str, key: str) -> None:
        while not stop.is_set():
            rec = ClientRecord(tenant, user=f"{tenant}-{len(records)}")
            records.append(rec)
            await fill_record(rec, client, key, target.body(max_tokens), None)
            if rec.ending == "rejected":
                await asyncio.sleep(0.2)  # a polite client backs off on 429

    await asyncio.gather(*(worker(t, k) for t, k in target.keys.items() for _ in range(per_tenant)))
    return records


def _completed_between(records: list[ClientRecord], start: float, end: float) -> float:
    done = [r for r in records if r.ending == "completed" and start <= r.ended < end]
    return len(done) / max(end - start, 1e-9)


async def replica_crash(
    target: Target,
    kill: Fault,
    recovered: Callable[[], Awaitable[bool]],
    warm_s: float = 6.0,
    after_s: float = 8.0,
    per_tenant: int = 2,
    max_tokens: int = 24,
    recover_timeout_s: float = 120.0,
) -> DrillReport:
    """Kill a replica under steady load from every tenant; wait until Serve has replaced it."""
    async with target.client() as client:
        stop = asyncio.Event()
        times: dict[str, float] = {}

        async def run() -> list[ClientRecord]:
            load = asyncio.create_task(_steady(client, target, per_tenant, max_tokens, stop))
            await asyncio.sleep(warm_s)
            times["kill"] = time.monotonic()
            await kill()
            deadline = times["kill"] + recover_timeout_s
            await asyncio.sleep(1.0)
            while not await recovered() and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            times["recovered"] = time.monotonic()
            await asyncio.sleep(after_s)
            times["end"] = time.monotonic()
            stop.set()
            return await load

        records, server = await _counted(client, target, run)
    kill_at, back_at = times["kill"], times["recovered"]
    return _report(
        "replica_crash",
        records,
        server,
        retried=server["retried"],
        recover_s=round(back_at - kill_at, 1),
        rps_before=round(_completed_between(records, kill_at - warm_s / 2, kill_at), 2),
        rps_after=round(_completed_between(records, back_at, times["end"]), 2),
        errored_codes=",".join(sorted({r.code or "?" for r in records if r.ending == "errored"})),
    )
