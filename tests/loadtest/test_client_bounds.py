"""The client ends every request (completion, HTTP error, stream error, timeout, deadline) and keeps
to its bounds: requests in flight, request count and the run's duration. Loopback fake server."""

from __future__ import annotations

import time

import pytest

from loadtest.metrics import errors_by_type, group_metrics
from loadtest.runner import run_scenario
from loadtest.scenario import Scenario
from tenancy import SLAClass
from tests.loadtest.fake_server import LONG_TOKEN_GAP_S

CLASSES = {"standard": SLAClass(name="standard", priority_tier=1, ttft_target_s=1.0, tpot_target_s=0.5,
                                e2e_target_s=10.0)}  # fmt: skip


def _scenario(tenants: list[dict], **kw) -> Scenario:
    base = {"name": "bounds", "duration_s": 2.0, "request_timeout_s": 1.0, "drain_timeout_s": 2.0, "seed": 3}
    return Scenario.model_validate(base | kw | {"tenants": tenants})


def _tenant(tid: str, key: str, **kw) -> dict:
    return {"id": tid, "api_key": key, "sla_class": "standard", "output": {"kind": "fixed", "tokens": 5}} | kw


def test_every_request_ends_with_its_status(fake) -> None:
    url, _ = fake
    scenario = _scenario(
        [
            _tenant("ok", "ok", rate=5.0),
            _tenant("rejected", "reject", rate=3.0),
            _tenant("boom", "boom", rate=2.0),
            _tenant("slow", "slow", rate=2.0),
            _tenant("broken", "broken", rate=2.0),
        ]
    )
    result = run_scenario(scenario, url, show_progress=False)
    by = {
        t: [r for r in result.records if r.tenant == t] for t in ("ok", "rejected", "boom", "slow", "broken")
    }
    assert all(r.end is not None and r.end >= r.sent for r in result.records)
    assert all(r.status == "ok" and r.output_tokens == 5 and len(r.token_times) == 5 for r in by["ok"])
    assert all(r.first_token is not None and r.prompt_tokens > 0 for r in by["ok"])
    assert all(r.rejected and r.error == "429:rate_limit_exceeded" for r in by["rejected"])
    assert all(r.status == "http_error" and r.error == "500:server_error" for r in by["boom"])
    assert all(r.status == "timeout" and 0.9 <= r.end - r.sent < 2.0 for r in by["slow"])
    assert all(r.status == "stream_error" and r.error == "stream:token_timeout" for r in by["broken"])
    assert all(by.values())
    assert result.replica_seconds > 0  # the fake's /health says 2 replicas


def test_in_flight_and_request_count_stay_bounded(fake) -> None:
    url, state = fake
    state.max_in_flight = 0
    before = state.received
    scenario = _scenario([_tenant("a", "ok", rate=200.0)], max_in_flight=3, max_requests=40)
    result = run_scenario(scenario, url, show_progress=False)
    assert len(result.records) == 40
    assert state.received - before == 40
    assert state.max_in_flight <= 3
    assert all(r.status == "ok" for r in result.records)
    # Waiting for a connection slot is not part of the request's latency: sent ≥ scheduled.
    assert max(r.sent - r.scheduled for r in result.records) > 0


def test_closed_loop_keeps_its_concurrency(fake) -> None:
    url, state = fake
    state.max_in_flight = 0
    result = run_scenario(
        _scenario([_tenant("c", "ok", concurrency=2)], duration_s=1.0), url, show_progress=False
    )
    assert state.max_in_flight <= 2
    assert len(result.records) >= 4 and all(r.ok for r in result.records)
    assert max(r.sent for r in result.records) < 1.0  # nothing new after the duration


@pytest.mark.timeout(30)
def test_a_request_still_streaming_at_the_loads_end_is_drained_and_completes(fake) -> None:
    """Answers of 1.5 s against 1 s of load: the run waits until every one has ended (the condition,
    far sooner than the bound), and counts them as completed; nothing is cut."""
    url, _ = fake
    answer_s = 15 * LONG_TOKEN_GAP_S
    scenario = _scenario(
        [
            _tenant("l", "long", rate=4.0, output={"kind": "fixed", "tokens": 15}),
            _tenant("c", "long", concurrency=1),
        ],
        duration_s=1.0,
        request_timeout_s=30.0,
        drain_timeout_s=None,
    )
    start = time.monotonic()
    result = run_scenario(scenario, url, show_progress=False)
    took = time.monotonic() - start
    streaming = [r for r in result.records if r.first_token is not None and r.first_token < 1.0 < r.end]
    assert streaming  # some answers were mid-stream when the load stopped; all of them ended
    assert all(r.status == "ok" and r.output_tokens == len(r.token_times) for r in result.records)
    assert any(r.tenant == "c" and r.end > 1.0 for r in result.records)  # the closed loop's, drained too
    drain = result.drain
    assert drain["open_requests"] >= len(streaming) and not drain["capped"]
    assert drain["waited_s"] < answer_s + 1.0 < drain["seconds"]  # the condition ended it, not the bound
    assert took < 1.0 + answer_s + 3.0
    g = group_metrics(result.records, CLASSES, 2.5)
    assert (g["ok"], g["cut"], g["failed"]) == (len(result.records), 0, 0)


@pytest.mark.timeout(30)
def test_the_drain_cap_cuts_what_is_left_and_no_attainment_counts_it(fake) -> None:
    url, _ = fake
    scenario = _scenario([_tenant("s", "slow", rate=4.0)], request_timeout_s=30.0, drain_timeout_s=0.5)
    start = time.monotonic()
    result = run_scenario(scenario, url, show_progress=False)
    took = time.monotonic() - start
    assert took < 2.0 + 0.5 + 2.0  # duration + drain cap + slack for set-up and cancellation
    assert result.records and all(r.cut and r.status == "cut" for r in result.records)
    assert all(r.error == "client_deadline" and r.end is not None for r in result.records)
    assert result.drain["capped"] and result.drain["seconds"] == 0.5
    g = group_metrics(result.records, CLASSES, 2.5)
    assert g["cut"] == len(result.records) and g["failed"] == 0 and g["rejected"] == 0
    assert g["sla_attainment"] is None and g["ttft_attainment"] is None  # no verdict, so no miss
    assert errors_by_type(result.records) == {}  # not an error either


def test_several_client_processes_send_the_same_plan_as_one(fake) -> None:
    """Sharded over 3 processes, the run sends the requests one process would (the same seeded times,
    tenants and lengths), each once, on one clock; closed-loop workers are shared out too."""
    url, _ = fake
    tenants = [_tenant("a", "ok", rate=6.0), _tenant("b", "ok", rate=4.0), _tenant("c", "ok", concurrency=3)]
    one = run_scenario(_scenario(tenants), url, show_progress=False)
    three = run_scenario(_scenario(tenants, client_procs=3), url, show_progress=False)

    def planned(result) -> list[tuple]:
        return sorted(
            (r.tenant, round(r.scheduled, 6), r.max_tokens) for r in result.records if r.tenant != "c"
        )

    assert planned(three) == planned(one) and planned(one)
    assert len({r.request_id for r in three.records}) == len(three.records)  # each once
    assert all(r.status == "ok" and 0 <= r.sent <= r.end for r in three.records)
    closed = [r for r in three.records if r.tenant == "c"]
    assert len(closed) >= 3 and all(r.sent < 2.0 + 0.5 for r in closed)  # its workers ran, on the run's clock
    assert three.records == sorted(three.records, key=lambda r: (r.scheduled, r.tenant))
