"""A router's SLA signals: a tenant's demand counts its backlog, so a flood stays over-share after
its arrivals leave the signals window (the policy alone, no Ray)."""

from __future__ import annotations

from cluster.serving.sla_router_signals import ArrivalLog
from cluster.serving.sla_share import within_fraction
from tenancy import FairQueue, default_tenancy_config

WINDOW_S = 10.0
FLOOD = 48


TENANCY = default_tenancy_config()
WORK = FLOOD * (100 + 2 * 200)  # the flood's fair-share work: prompt + 2 x max_tokens each


def _carol_seen(log: ArrivalLog, arrived_at: float, polls: tuple[float, ...]) -> list:
    """carol's load at each poll of ``log``, her flood of FLOOD requests arrived at ``arrived_at``
    and still waiting (nothing served)."""
    queue = FairQueue.from_config(TENANCY)
    waiting = [queue.make_request(f"c{i}", "carol", 100, 200, arrival=arrived_at) for i in range(FLOOD)]
    out = []
    for now in polls:
        log.note(waiting, [], now=now)
        out.append({t.tenant_id: t for t in log.tenants(waiting, TENANCY, now=now)}["carol"])
    return out


def test_a_flood_whose_arrivals_left_the_window_keeps_its_demand() -> None:
    # 1 s after the flood, then 30 s on, when its arrivals have left the window
    fresh, later = _carol_seen(ArrivalLog(WINDOW_S), arrived_at=0.0, polls=(1.0, 30.0))
    assert fresh.demand == later.demand == WORK / WINDOW_S
    assert later.window_rate_rps == 0.0 and later.waiting_requests == FLOOD
    # against a bound that serves a tenth of that, the flood stays mostly over its share
    assert within_fraction([later], capacity=WORK / WINDOW_S / 10)["carol"] < 0.11


def test_waiting_requests_inside_the_window_are_counted_once() -> None:
    (carol,) = _carol_seen(ArrivalLog(WINDOW_S), arrived_at=25.0, polls=(30.0,))
    assert carol.demand == WORK / WINDOW_S
