"""The Redis outage drill: stop the shared quota store under load, check that every router serves on
local limits and says "degraded", start it again and time the reconnection.

The quota check needs one tenant whose requests-per-minute quota the load exceeds: over the whole
drill it may be admitted at most its bucket, plus the refill over the drill's length, plus one
refill window (the local buckets the routers use during the outage, each ``1 / routers`` of it).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx

from cluster.ops.chaos_client import ClientRecord
from cluster.ops.chaos_drills import DrillReport, Fault, Target, _counted, _pct, _report, _steady
from cluster.ops.router_timings import admission_s, router_records, stage_summary


async def router_health(client: httpx.AsyncClient, routers: int, max_scrapes: int = 60) -> dict[str, str]:
    """Each router's /health status (the proxy picks one router per call: ask until all answered)."""
    seen: dict[str, str] = {}
    for _ in range(max_scrapes):
        body = (await client.get("/health")).json()
        seen[body.get("router", "?")] = body["status"]
        if len(seen) >= routers:
            break
    return seen


async def _wait_status(client: httpx.AsyncClient, routers: int, status: str, timeout_s: float) -> float:
    """Seconds until every router reports ``status`` (``timeout_s`` + 1 when it never happened)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        seen = await router_health(client, routers)
        if len(seen) >= routers and set(seen.values()) == {status}:
            return time.monotonic() - started
        await asyncio.sleep(0.25)
    return timeout_s + 1


async def redis_outage(
    target: Target,
    stop_redis: Fault,
    start_redis: Fault,
    limited: tuple[str, str, int],
    before_s: float = 4.0,
    outage_s: float = 8.0,
    after_s: float = 6.0,
    per_tenant: int = 1,
    max_tokens: int = 4,
    status_timeout_s: float = 20.0,
    push_workers: int = 6,
    yields_to_pusher: frozenset[str] = frozenset(),
) -> DrillReport:
    """``limited`` = (tenant id, key, requests per minute) of the tenant that pushes past its quota.
    ``yields_to_pusher``: steady tenants that fair share may rightly put behind the pusher's burst
    (its tier, or a lower one). Their load runs and is accounted, but the latency comparison leaves
    them out: it measures Redis's effect, and their wait is the queue's order."""
    tenant_id, key, rpm = limited
    pushy = Target(target.base_url, {tenant_id: key}, target.admin_key, target.model, target.routers)
    times: dict[str, float] = {}
    # The client outwaits the routers' own bounds (queue and first-token timeouts, 60 s each by
    # default): a request too slow ends with the router's explicit error, which both sides count
    # alike, not with the client's read timeout racing it (client errored, router aborted).
    async with target.client() as client:
        stop = asyncio.Event()

        async def run() -> list:
            times["start"] = time.monotonic()
            load = asyncio.gather(
                _steady(client, target, per_tenant, max_tokens, stop),
                _steady(client, pushy, push_workers, 1, stop),
            )
            await asyncio.sleep(before_s)
            times["down"] = time.monotonic()
            await stop_redis()
            times["degraded_after_s"] = await _wait_status(
                client, target.routers, "degraded", status_timeout_s
            )
            await asyncio.sleep(max(0.0, outage_s - (time.monotonic() - times["down"])))
            times["up"] = time.monotonic()
            await start_redis()
            times["reconnect_s"] = await _wait_status(client, target.routers, "ok", status_timeout_s)
            await asyncio.sleep(after_s)
            stop.set()
            steady, pushed = await load
            times["end"] = time.monotonic()
            return steady + pushed

        records, server = await _counted(client, target, run)
        steady = SteadyLoad.of(records, times, tenant_id)
        report = _outage_report(
            records, server, times, tenant_id, rpm, target.routers, steady, yields_to_pusher
        )
        report.figures |= await _router_figures(client, target, steady)
    return report


@dataclass
class SteadyLoad:
    """The steady tenants' requests (the pusher's aside), by when they started: in the outage or
    around it; and the slowest of each, keyed by its figures' prefix."""

    during: list[ClientRecord]
    normal: list[ClientRecord]
    slowest: dict[str, ClientRecord]

    @classmethod
    def of(cls, records: list[ClientRecord], times: dict[str, float], pusher: str) -> SteadyLoad:
        steady = [r for r in records if r.tenant != pusher]
        during = [r for r in steady if times["down"] <= r.started < times["up"]]
        normal = [r for r in steady if r.started < times["down"] or r.started >= times["up"]]
        picks = {"slowest_outage_": during, "slowest_normal_": normal}
        slowest = {prefix: max(group, key=lambda r: r.latency) for prefix, group in picks.items() if group}
        return cls(during, normal, slowest)


async def _router_figures(client: httpx.AsyncClient, target: Target, steady: SteadyLoad) -> dict:
    """What the routers saw: the slowest requests' stages, and the longest quota check of a steady
    request started in the outage (a request waiting on a Redis that is away would show there)."""
    wanted = {r.user for r in steady.during} | {r.user for r in steady.slowest.values()}
    timings = await router_records(client, target, {u for u in wanted if u})
    admissions = [admission_s(timings[r.user]) for r in steady.during if r.user in timings]
    return {
        **{f"{prefix}router": stage_summary(timings.get(r.user)) for prefix, r in steady.slowest.items()},
        "outage_admit_max_s": round(max((a for a in admissions if a is not None), default=-1.0), 3),
        "outage_admit_found": f"{len(admissions)}/{len(steady.during)}",
    }


def _outage_report(
    records,
    server,
    times,
    tenant_id: str,
    rpm: int,
    routers: int,
    steady: SteadyLoad,
    yielding: frozenset[str],
) -> DrillReport:
    span = times["end"] - times["start"]
    admitted = sum(r.tenant == tenant_id and r.ending != "rejected" for r in records)
    # bucket + refill over the drill + one refill window (the routers' local buckets together)
    bound = rpm + rpm * span / 60.0 + rpm
    # The latencies compare the steady load with itself: the pushing tenant's thousands of fast
    # refusals, mixed in, made each percentile land on a different rank of the served requests (the
    # outage window's p99 was near its slowest answer, the rest's near its median).
    during, normal = steady.during, steady.normal
    compared_during = [r for r in during if r.tenant not in yielding]
    compared_normal = [r for r in normal if r.tenant not in yielding]
    yielded = [r for r in during + normal if r.tenant in yielding]
    refused_during = [
        r for r in records if r.ending == "rejected" and times["down"] <= r.started < times["up"]
    ]
    return _report(
        "redis_outage",
        records,
        server,
        degraded_after_s=round(times["degraded_after_s"], 2),
        reconnect_s=round(times["reconnect_s"], 2),
        served_during_outage=sum(r.ending == "completed" for r in during),
        outage_latency_p99_s=round(_pct([r.latency for r in compared_during], 0.99), 3),
        normal_latency_p99_s=round(_pct([r.latency for r in compared_normal], 0.99), 3),
        yielding_latency_p99_s=round(_pct([r.latency for r in yielded], 0.99), 3),
        outage_reject_p99_s=round(_pct([r.latency for r in refused_during], 0.99), 3),
        **{
            k: v
            for prefix, r in steady.slowest.items()
            for k, v in _timeline(prefix, r, times["down"]).items()
        },
        limited_admitted=admitted,
        limited_rejected=sum(r.tenant == tenant_id and r.ending == "rejected" for r in records),
        limited_bound=round(bound, 1),
        routers=routers,
    )


def _timeline(prefix: str, record: ClientRecord, origin: float) -> dict[str, float | str]:
    """Where one request's time went, as the client saw it: when it started (seconds after
    ``origin``), then its headers, first token and end (seconds after it started); -1 for a step it
    never reached. A slow answer tells the router's wait (headers) from its stream."""

    def since_start(at: float) -> float:
        return round(at - record.started, 3) if at else -1.0

    return {
        f"{prefix}started_s": round(record.started - origin, 3),
        f"{prefix}headers_s": since_start(record.answered),
        f"{prefix}first_token_s": since_start(record.first_token),
        f"{prefix}latency_s": round(record.latency, 3),
        f"{prefix}ending": record.ending,
    }
