"""Fault 3: the shared Redis stops under load with two routers, then comes back.

A private redis-server is used (the shared one is never touched).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator

import pytest
from ray import serve

from cluster.ops.chaos_redis import redis_outage
from tests.cluster.helpers import start_app
from tests.faults.fault_helpers import METERED_KEY, METERED_RPM, assert_accounted, target
from tests.redis_server import RedisProcess

OUTAGE_APP, OUTAGE_PREFIX = "fl-outage", "/outage"
FALLBACK_FRACTION = 0.4
BATCH_TENANTS = frozenset({"carol"})  # the steady tenants in the pusher's tier (batch)


@pytest.fixture
def outage_app(fault_port: int, fault_config: dict) -> Iterator[tuple[str, RedisProcess]]:
    redis = RedisProcess().start()
    config = fault_config | {
        "num_replicas": 1,
        "num_routers": 2,
        "redis_url": redis.url,
        "redis_prefix": "outage",
        # While Redis is down each router allows f of every quota, refilling at f of the rate: n
        # routers admit at most n*f*rpm*(1 + T/60) in a T-second outage. 2 * 0.4 * (1 + 8/60) < 1
        # keeps that within the one refill window the bound allows.
        "redis_fallback_fraction": FALLBACK_FRACTION,
    }
    start_app(OUTAGE_APP, OUTAGE_PREFIX, config)
    try:
        yield f"http://127.0.0.1:{fault_port}{OUTAGE_PREFIX}", redis
    finally:
        serve.delete(OUTAGE_APP)
        redis.kill()


@pytest.mark.slow
def test_redis_outage_degrades_then_reconnects_within_quota(outage_app) -> None:
    url, redis = outage_app

    async def stop() -> None:
        await asyncio.to_thread(redis.kill)

    async def start() -> None:
        await asyncio.to_thread(redis.start)

    # Four times more pushing workers than the quota's burst (10): the excess is refused at once,
    # however slowly this box serves what is admitted, and the bound must hold through the outage
    # and the reconnection with 40 of them racing the debits.
    limited = ("metered", METERED_KEY, METERED_RPM)
    # The window runs until a late router's debt is repaid. Each router charges its local
    # admissions back to the restarted Redis when it reconnects. A router that reconnects after
    # the other has used the fresh bucket puts it into debt, at most its local share
    # ceil(f * rpm) * (1 + T/60). Refill repays that in 60 * debt / rpm seconds, during which the
    # tenant is refused. A window that ends sooner counts that router's local admissions without
    # the refusals that pay for them. The longer window does not hide a lost debit: without the
    # debt, refill keeps admitting through the extra seconds, and the bound grows only by that.
    outage_s = 8.0
    debt = math.ceil(FALLBACK_FRACTION * METERED_RPM) * (1 + outage_s / 60)
    after_s = 6.0 + 60.0 * debt / METERED_RPM  # 6 s after reconnecting, then the repayment (27 s)
    report = asyncio.run(
        redis_outage(
            target(url, routers=2),
            stop,
            start,
            limited,
            outage_s=outage_s,
            after_s=after_s,
            push_workers=40,
            yields_to_pusher=BATCH_TENANTS,
        )
    )
    assert_accounted(report)
    f = report.figures
    assert f["degraded_after_s"] <= 20 and f["reconnect_s"] <= 20, f  # both routers said so, both came back
    assert f["served_during_outage"] > 0, f  # admission went on with local limits
    # No request hung on Redis: the steady tenants' latency during the outage stays near that of the
    # same load around it (on this 2-core box the load alone takes several seconds per request, so no
    # absolute bound), and a refusal during the outage is as fast as any (it waits on no Redis call).
    # Carol shares the batch tier with the pusher, whose burst when Redis returns empty fair share
    # rightly serves first (carol has had more): her wait is the queue's order, so she is left out of
    # the comparison (her load still runs and is accounted), and the quota check is timed directly.
    assert f["outage_latency_p99_s"] < max(10.0, 1.5 * f["normal_latency_p99_s"] + 2.0), f
    assert f["outage_reject_p99_s"] < 2.0, f
    # Measured in the routers: every steady request started in the outage was found, and none waited
    # on its quota check (the local share answers at once) longer than a refusal may take.
    found, started = map(int, f["outage_admit_found"].split("/"))
    assert found == started > 0, f
    assert 0.0 <= f["outage_admit_max_s"] < 2.0, f
    assert f["limited_rejected"] > 0, f  # the load did push the metered tenant past its quota
    assert f["limited_admitted"] <= f["limited_bound"], f
    assert report.client["errored"] == 0, report.to_dict()
    refused = {r.code for r in report.records if r.ending == "rejected"}
    assert refused <= {"rpm", "tpm"}, refused  # only the metered tenant's quota refused anything
