"""The drills' reading of a request's router timing record (cluster/ops/router_timings.py)."""

from __future__ import annotations

from cluster.ops.router_timings import admission_s, stage_summary

SERVED = {
    "received": 10.0,
    "arrival": 10.05,
    "admitted": 10.25,
    "dispatched": 13.25,
    "first_token": 13.75,
    "engine_queue": 0.1,
    "engine_ttft": 0.45,
    "outcome": "ok",
}


def test_each_stage_runs_from_the_stamp_before_it() -> None:
    assert stage_summary(SERVED) == (
        "received +0.000; parsed +0.050; admitted +0.200; dispatched +3.000; first_token +0.500; "
        "engine queue 0.1, engine ttft 0.45; ok"
    )


def test_a_refused_request_ends_at_its_last_stamp() -> None:
    refused = {"received": None, "arrival": 5.0, "admitted": None, "outcome": "rejected"}
    assert stage_summary(refused) == "parsed +0.000; engine queue None, engine ttft None; rejected"
    assert admission_s(refused) is None
    assert stage_summary(None) == "not found"


def test_admission_is_the_quota_check_alone() -> None:
    assert admission_s(SERVED) == 10.25 - 10.05
