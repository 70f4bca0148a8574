"""The load generator and the cluster's own SLA report agree on the same run (``fairlane serve`` with
its default edge, SmolLM2 on CPU).

Tolerance on TTFT: the server starts its clock when the request reaches the router and stops it at
the router's first output; the client starts before sending and stops when it has parsed the first
SSE chunk. The client's figure therefore includes the edge (HAProxy, then the router's own HTTP
entry), SSE framing and both event loops' scheduling, and is never below the server's (beyond
clock-read jitter, allowed 10 ms). The bounds: percentiles within +0.75 s, every request within
+1 s, the median within +0.1 s. A wrong definition (timing from the scheduled instead of the sent
instant, or to the last token) is off by more than the median's bound here.

Measured on a 2-core box (this scenario, twice each): through the default edge the median was
8-13 ms, alone or beside two busy loops; through Serve's Python proxy, which the session's shared Ray
runs, it was 30 ms alone, 18-43 ms beside the loops, and 150 ms in a CI run beside the other test
worker. That proxy is not the deployment users start, so the test measures the one they do.
"""

from __future__ import annotations

import pytest

from loadtest.agreement import tenant_agreement, ttft_deltas
from loadtest.runner import run_scenario
from loadtest.scenario import Scenario
from tenancy import DEMO_ADMIN_KEY, DEMO_KEYS

BELOW_S = 0.010
ABOVE_S = 0.75
REQUEST_ABOVE_S = 1.0
MEDIAN_ABOVE_S = 0.1

SCENARIO = {
    "name": "agreement",
    "duration_s": 5.0,
    "request_timeout_s": 60.0,
    "drain_timeout_s": 60.0,
    "seed": 11,
    "tenants": [
        {
            "id": "alice",
            "api_key": DEMO_KEYS["alice"],
            "sla_class": "interactive",
            "weight": 2.0,
            "rate": 1.0,
            "arrival": {"process": "constant"},
            "output": {"kind": "fixed", "tokens": 8},
        },
        {
            "id": "bob",
            "api_key": DEMO_KEYS["bob"],
            "sla_class": "standard",
            "concurrency": 1,
            "prompt": {"kind": "fixed", "tokens": 40},
            "output": {"kind": "fixed", "tokens": 6},
        },
    ],
}


@pytest.mark.own_ray  # its own `fairlane serve`: the default edge, as a user starts it
@pytest.mark.timeout(420)
def test_client_and_cluster_sla_report_agree(cluster_url: str) -> None:
    result = run_scenario(
        Scenario.model_validate(SCENARIO), cluster_url, admin_key=DEMO_ADMIN_KEY, show_progress=False
    )
    assert result.records and all(r.ok for r in result.records), [r.error for r in result.records if not r.ok]
    assert {"sla", "timings"} <= set(result.server)
    agreement = tenant_agreement(result.records, result.server["sla"])
    assert set(agreement) == {"alice", "bob"}
    for tenant, a in agreement.items():
        assert a["client_requests"] == a["server_requests"] > 0, tenant
        assert a["client_ok"] == a["server_ok"], tenant
        for p in (50, 95, 99):
            client, server = a[f"client_ttft_p{p}"], a[f"server_ttft_p{p}"]
            assert server - BELOW_S <= client <= server + ABOVE_S, (tenant, p, client, server)
    deltas = ttft_deltas(result.records, result.server["timings"])
    assert len(deltas) == len(result.records)  # every request matched by its response id
    assert all(-BELOW_S <= d <= REQUEST_ABOVE_S for d in deltas), deltas
    assert sorted(deltas)[len(deltas) // 2] <= MEDIAN_ABOVE_S, deltas
