"""The soak, short (CI): mixed streaming load with a disconnect storm, an overload burst, a replica
kill and a Redis restart interleaved; nothing lost or hung, the books balance, and the routers and
replicas hold at the end what they held at the start. ``fairlane chaos soak`` runs the long one
(BENCHMARKS.md), where memory is compared too: a short run is all warm-up for that."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis as redis_client
from ray import serve

from cluster.ops.chaos_ray import ReplicaKiller
from cluster.ops.chaos_soak import SoakFaults, SoakPlan, soak
from tests.cluster.helpers import start_app
from tests.faults.fault_helpers import assert_accounted, target
from tests.redis_server import RedisProcess

SOAK_APP, SOAK_PREFIX = "fl-soak", "/soak"


@pytest.fixture
def soak_app(fault_port: int, fault_config: dict) -> Iterator[tuple[str, RedisProcess]]:
    redis = RedisProcess().start()
    config = fault_config | {"num_replicas": 2, "redis_url": redis.url, "redis_prefix": "soak"}
    start_app(SOAK_APP, SOAK_PREFIX, config)
    try:
        yield f"http://127.0.0.1:{fault_port}{SOAK_PREFIX}", redis
    finally:
        serve.delete(SOAK_APP)
        redis.kill()


@pytest.mark.slow
def test_short_soak_loses_nothing_and_leaks_nothing(soak_app) -> None:
    url, redis = soak_app
    killer = ReplicaKiller(SOAK_APP)

    async def stop_redis() -> None:
        await asyncio.to_thread(redis.kill)

    async def start_redis() -> None:
        await asyncio.to_thread(redis.start)

    faults = SoakFaults(killer.kill, killer.recovered, stop_redis, start_redis)
    # Four faults (storm, burst, Redis restart, replica kill), one every 15 s, under steady load.
    plan = SoakPlan(duration_s=75.0, cycle_s=15.0, per_tenant=1, storm_clients=20, burst_rate=8.0,
                    burst_s=4.0, redis_down_s=3.0, sample_s=2.0, window_s=20.0)  # fmt: skip
    report = asyncio.run(soak(target(url), faults, plan))
    f = report.figures
    assert_accounted(report)
    assert [
        x for x in ("storm", "burst", "redis_restart", "replica_kill") if x not in f["fault_log"]
    ] == [], f
    assert f["lost"] == 0 and f["hung"] == 0, f
    assert report.client["completed"] > 0, report.client
    for held in ("in_flight", "queued", "waiters", "leases", "kv_blocks_used"):
        assert f[f"after_{held}"] == f[f"before_{held}"] == 0, (held, f)
    assert f["before_replicas_reporting"] == f["after_replicas_reporting"] == 2, f  # KV read on each
    shared = redis_client.Redis.from_url(redis.url, decode_responses=True)
    slots = {key: shared.zcard(key) for key in shared.scan_iter(match="soak:*:conc")}
    shared.close()
    assert not any(slots.values()), slots  # no concurrency slot left in Redis
