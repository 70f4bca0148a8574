"""SLA report arithmetic on hand-made timing records (no Ray)."""

from __future__ import annotations

import pytest

from cluster.telemetry.request_timing import RequestTiming
from cluster.telemetry.sla_report import build_report, percentile
from tenancy import default_tenancy_config


def rec(tenant: str, cls: str, ttft: float, e2e: float, out: int, outcome: str = "ok") -> RequestTiming:
    return RequestTiming(
        f"{tenant}-{ttft}-{e2e}",
        tenant,
        cls,
        arrival=100.0,
        first_token=100.0 + ttft,
        end=100.0 + e2e,
        prompt_tokens=10,
        output_tokens=out,
        outcome=outcome,
    )  # type: ignore[arg-type]


def test_tpot_follows_the_vllm_definition() -> None:
    r = rec("alice", "interactive", 0.2, 1.2, 11)
    assert r.tpot == pytest.approx(0.1)
    assert rec("alice", "interactive", 0.2, 0.2, 1).tpot is None


def test_percentiles_attainment_goodput_and_cost() -> None:
    config = default_tenancy_config()  # interactive: TTFT 1 s, TPOT 0.1 s; $5 per GPU-hour
    records = [
        rec("alice", "interactive", 0.5, 1.0, 6),
        rec("alice", "interactive", 2.0, 2.5, 6),
        rec("alice", "interactive", 0.1, 0.1, 0, outcome="rejected"),
    ]
    report = build_report(records, config, window_s=10.0, replica_seconds=3600.0)
    alice = report.tenants[0]
    assert (alice.ok, alice.rejected, alice.failed) == (2, 1, 0)
    assert alice.ttft_s == {"p50": 0.5, "p95": 2.0, "p99": 2.0}
    assert alice.sla_attainment == pytest.approx(0.5)  # the rejected request does not count as served
    assert alice.goodput_rps == pytest.approx(0.1)
    assert report.gpu_dollars == pytest.approx(5.0)
    assert alice.dollars_per_success == pytest.approx(2.5)  # the only tenant pays the whole hour
    assert percentile([], 50) is None
