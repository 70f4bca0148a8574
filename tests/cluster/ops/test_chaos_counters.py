"""The drills read the routers' endings from /metrics; clients that left a generation route before
any answer started (status 499) are read beside them, and no other route's 499 is."""

from __future__ import annotations

from cluster.ops.chaos_client import counter_delta, parse_counters

PAGE = """# TYPE fairlane_router_info gauge
fairlane_router_info{router="r1"} 1.0
# TYPE fairlane_requests counter
fairlane_requests_total{tenant="alice",sla_class="interactive",outcome="ok"} 4.0
fairlane_requests_total{tenant="bob",sla_class="batch",outcome="aborted"} 2.0
fairlane_requests_total{tenant="bob",sla_class="batch",outcome="timeout"} 1.0
# TYPE fairlane_http_errors counter
fairlane_http_errors_total{route="/v1/chat/completions",status="499"} 3.0
fairlane_http_errors_total{route="/v1/completions",status="499"} 1.0
fairlane_http_errors_total{route="/health",status="499"} 5.0
fairlane_http_errors_total{route="/v1/chat/completions",status="429"} 2.0
"""


def test_endings_and_clients_that_left_unanswered_are_read_apart() -> None:
    router, endings, retries = parse_counters(PAGE)
    assert router == "r1" and retries == 0
    assert endings == {"completed": 4, "aborted": 2, "errored": 1, "left_unanswered": 4}
    delta = counter_delta({"completed": 1, "left_unanswered": 1}, endings)
    assert delta["sent"] == 3 + 2 + 1  # the endings only: a 499 is no ending of its own
    assert delta["left_unanswered"] == 3
