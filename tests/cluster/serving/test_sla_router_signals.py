"""A router's SLA signals: a tenant's demand counts its backlog, so a flood stays over-share after
its arrivals leave the signals window (the policy alone, no Ray)."""

from __future__ import annotations

from cluster.serving.sla_router_signals import ArrivalLog
from cluster.serving.sla_share import within_fraction
from tenancy import FairQueue, default_tenancy_config

WINDOW_S = 10.0
FLOOD = 48


def _flood(queue: FairQueue, at: float) -> list:
    return [queue.make_request(f"c{i}", "carol", 100, 200, arrival=at) for i in range(FLOOD)]


def test_a_flood_whose_arrivals_left_the_window_keeps_its_demand() -> None:
    tenancy = default_tenancy_config()
    queue = FairQueue.from_config(tenancy)
    waiting = _flood(queue, at=0.0)
    log = ArrivalLog(WINDOW_S)
    log.note(waiting, [], now=1.0)
    fresh = {t.tenant_id: t for t in log.tenants(waiting, tenancy, now=1.0)}["carol"]
    log.note(waiting, [], now=30.0)  # 30 s on, nothing served: the arrivals left the window
    later = {t.tenant_id: t for t in log.tenants(waiting, tenancy, now=30.0)}["carol"]
    work = FLOOD * (100 + 2 * 200)
    assert fresh.demand == later.demand == work / WINDOW_S
    assert later.window_rate_rps == 0.0 and later.waiting_requests == FLOOD
    # against a bound that serves a tenth of that, the flood stays mostly over its share
    assert within_fraction([later], capacity=work / WINDOW_S / 10)["carol"] < 0.11


def test_waiting_requests_inside_the_window_are_counted_once() -> None:
    tenancy = default_tenancy_config()
    queue = FairQueue.from_config(tenancy)
    waiting = _flood(queue, at=25.0)
    log = ArrivalLog(WINDOW_S)
    log.note(waiting, [], now=30.0)
    carol = {t.tenant_id: t for t in log.tenants(waiting, tenancy, now=30.0)}["carol"]
    assert carol.demand == FLOOD * (100 + 2 * 200) / WINDOW_S
