"""A tenancy reload keeps the fair-share state (issue 19, defect 5), without Ray: the dispatcher's
queue swap and the router core that makes it."""

from __future__ import annotations

import asyncio

import pytest

from cluster.config import AppConfig
from cluster.routing.dispatcher import Dispatcher
from cluster.routing.router_core import RouterCore
from tenancy import FairQueue, TenancyConfig, UnknownTenantError, default_tenancy_config


def without(config: TenancyConfig, tenant_id: str) -> TenancyConfig:
    """``config`` less one tenant (as a reloaded file would be)."""
    data = config.model_dump() | {"key_salt": config.key_salt.get_secret_value()}
    data["tenants"] = [t for t in data["tenants"] if t["id"] != tenant_id]
    return TenancyConfig.model_validate(data)


async def test_fair_share_counters_survive_a_reload() -> None:
    config = default_tenancy_config()  # alice interactive (weight 2), bob standard, carol batch
    now = [0.0]
    d = Dispatcher(FairQueue.from_config(config, clock=lambda: now[0]), 1, queue_timeout_s=5)
    held = await d.wait_turn(d.queue.make_request("c0", "carol", 10, 8))
    d.queue.charge("carol", 45)  # carol: 10 + 90 = 100
    waiting = asyncio.create_task(d.wait_turn(d.queue.make_request("b0", "bob", 40, 8)))
    d.queue.charge("alice", 300)  # alice, served elsewhere: 600 / weight 2 = 300
    urgent = asyncio.create_task(d.wait_turn(d.queue.make_request("a1", "alice", 100, 8)))
    doomed = asyncio.create_task(d.wait_turn(d.queue.make_request("c1", "carol", 10, 8)))
    await asyncio.sleep(0.01)
    now[0] = 1.0  # alice's request is at risk of its 1-s TTFT target: it goes before bob's
    held.release()
    alice = await asyncio.wait_for(urgent, 1)  # popped at counter 300: her tier's floor is 300 now
    before = {t: d.queue.counter(t) for t in ("alice", "bob")}
    assert before == {"alice": 300.0 + (100 + 2 * 8) / 2, "bob": 0.0}  # the pop reserves prompt + 2 × max

    d.replace_queue(FairQueue.from_config(without(config, "carol"), clock=lambda: now[0]))

    # The counters carry over: the reload forgives alice nothing, and bob, who waits, is not lifted
    # to the floor as if he had just arrived (that would cost him his place).
    assert {t: d.queue.counter(t) for t in ("alice", "bob")} == before
    # The service not yet shared with other routers (through Redis) carries over too.
    assert d.queue.take_local_service() == {"alice": 358.0}
    assert "b0" in d.queue and "c1" not in d.queue
    with pytest.raises(UnknownTenantError):  # its tenant is gone: it fails instead of waiting forever
        await asyncio.wait_for(doomed, 1)
    d.queue.charge("carol", 5)  # a removed tenant's request in flight finishes: charging it is a no-op
    alice.release()
    assert (await asyncio.wait_for(waiting, 1)).request.request_id == "b0"


class _Handle:
    """Stands in for the replicas' DeploymentHandle: RouterCore only asks it for options here."""

    def options(self, **_: object) -> _Handle:
        return self


def test_router_core_applies_a_config_and_keeps_the_counters() -> None:
    core = RouterCore(AppConfig(engine={"device": "cpu"}), _Handle())  # type: ignore[arg-type]
    (pool,) = core.pools.values()
    pool.dispatcher.queue.charge("alice", 100)
    pool.dispatcher.queue.charge("carol", 100)
    config = without(default_tenancy_config(), "carol")
    core.apply_tenancy(config)
    assert core.tenancy.config is config and pool.runner.quotas is pool.quotas
    assert pool.dispatcher.queue.counter("alice") == 100.0  # 200 / weight 2
    assert "carol" not in core.tenancy.config.tenants_by_id and "carol" not in pool.tenancy.tenants_by_id
