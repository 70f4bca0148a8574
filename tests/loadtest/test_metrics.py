"""Metric definitions on hand-built traces, with expected values worked out by hand."""

from __future__ import annotations

import pytest

from loadtest.metrics import e2e, errors_by_type, group_metrics, itls, meets_slo, percentiles, tpot, ttft
from tenancy import SLAClass
from tests.loadtest.trace import rec

FAST = SLAClass(name="interactive", priority_tier=0, ttft_target_s=1.0, tpot_target_s=0.1, e2e_target_s=5.0)
SLOW = SLAClass(name="batch", priority_tier=2, ttft_target_s=10.0, tpot_target_s=1.0, e2e_target_s=60.0)
CLASSES = {"interactive": FAST, "batch": SLOW}


def test_latencies_follow_vllm_definitions() -> None:
    # sent 1.0; tokens at 1.5, 1.6, 1.8, 2.1; end 2.1 → TTFT 0.5, E2E 1.1, TPOT (1.1−0.5)/3 = 0.2.
    r = rec(sent=1.0, tokens=(1.5, 1.6, 1.8, 2.1))
    assert ttft(r) == pytest.approx(0.5)
    assert e2e(r) == pytest.approx(1.1)
    assert tpot(r) == pytest.approx(0.2)
    assert itls(r) == pytest.approx([0.1, 0.2, 0.3])


def test_tpot_needs_two_tokens_and_failures_have_no_ttft() -> None:
    assert tpot(rec(sent=0.0, tokens=(0.4,))) is None
    failed = rec(sent=0.0, status="http_error", http_status=429, error="429:rate_limit_exceeded", end=0.01)
    assert ttft(failed) is None and tpot(failed) is None
    assert e2e(failed) == pytest.approx(0.01)


def test_percentiles_interpolate_linearly() -> None:
    # [1, 2, 3, 4]: p50 = 2.5; p90 = 1 + 0.9·3 = 3.7; p95 = 3.85; p99 = 3.97; mean 2.5.
    got = percentiles([4.0, 1.0, 3.0, 2.0])
    assert got == pytest.approx({"mean": 2.5, "p50": 2.5, "p90": 3.7, "p95": 3.85, "p99": 3.97})
    assert percentiles([]) == {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None}


def test_slo_needs_every_target() -> None:
    assert meets_slo(rec(sent=0, tokens=(0.5, 0.6, 0.7)), FAST)  # TTFT .5, TPOT .1, E2E .7
    assert not meets_slo(rec(sent=0, tokens=(1.5, 1.6)), FAST)  # TTFT 1.5 > 1
    assert not meets_slo(rec(sent=0, tokens=(0.5, 0.9, 1.3)), FAST)  # TPOT 0.4 > 0.1
    assert not meets_slo(rec(sent=0, tokens=(0.5, 0.55), end=6.0), FAST)  # E2E 6 > 5
    assert meets_slo(rec(sent=0, tokens=(0.5,)), FAST)  # one token: TPOT undefined, not failed
    assert not meets_slo(rec(sent=0, status="timeout", http_status=200, error="client_timeout", end=9), SLOW)


def test_group_metrics_counts_goodput_and_attainment() -> None:
    records = [
        rec("a", 0.0, (0.5, 0.6, 0.7)),  # meets interactive
        rec("a", 1.0, (3.0, 3.1)),  # TTFT 2.0: misses
        rec("a", 2.0, status="http_error", http_status=429, error="429:rate_limit_exceeded", end=2.01),
        rec("a", 3.0, status="timeout", http_status=200, error="client_timeout", end=4.0),
    ]
    g = group_metrics(records, CLASSES, window_s=4.0)
    assert (g["requests"], g["ok"], g["rejected"], g["failed"]) == (4, 2, 1, 1)
    assert g["slo_met"] == 1
    assert g["sla_attainment"] == pytest.approx(1 / 3)  # met / served (the 429 is not served)
    assert g["attainment_all"] == pytest.approx(1 / 4)
    assert g["goodput_rps"] == pytest.approx(1 / 4.0)
    assert g["request_throughput_rps"] == pytest.approx(2 / 4.0)
    assert g["output_tokens"] == 5 and g["output_throughput_tps"] == pytest.approx(5 / 4.0)
    assert g["ttft_s"]["p50"] == pytest.approx((0.5 + 2.0) / 2)
    assert g["tpot_s"]["p50"] == pytest.approx((0.1 + 0.1) / 2)


def test_errors_are_counted_by_type() -> None:
    records = [
        rec(status="http_error", http_status=429, error="429:rate_limit_exceeded", end=0.1),
        rec(status="http_error", http_status=429, error="429:rate_limit_exceeded", end=0.1),
        rec(status="timeout", error="client_timeout", end=1.0),
        rec(tokens=(0.1,)),
    ]
    assert errors_by_type(records) == {"429:rate_limit_exceeded": 2, "client_timeout": 1}


def test_ttft_tpot_and_whole_sla_attainment_are_apart_and_a_cut_request_is_in_none() -> None:
    """FAST: TTFT 1 s, TPOT 0.1 s, E2E 5 s. Five requests judged (four served, one refused), two cut."""
    long_answer = tuple(0.5 + 0.09 * i for i in range(60))  # TTFT .5, TPOT .09, E2E 5.81
    records = [
        rec("a", 0.0, (0.5, 0.6, 0.7)),  # all three met
        rec("a", 1.0, (3.0, 3.05)),  # TTFT 2.0 missed; TPOT .05 met
        rec("a", 2.0, (2.5, 3.0, 3.5)),  # TTFT .5 met; TPOT .5 missed
        rec("a", 0.0, long_answer),  # TTFT and TPOT met; E2E 5.81 missed: the whole SLA missed
        rec("a", 3.0, status="http_error", http_status=429, error="429:rate_limit_exceeded", end=3.01),
        rec(
            "a", 4.0, (4.2,), status="cut", error="client_deadline", end=9.0
        ),  # first token in time: still none
        rec("a", 5.0, status="cancelled", error="run_deadline", end=9.0),  # an older run's cut
    ]
    g = group_metrics(records, CLASSES, window_s=10.0)
    assert (g["requests"], g["ok"], g["rejected"], g["failed"], g["cut"]) == (7, 4, 1, 0, 2)
    assert g["ttft_attainment"] == pytest.approx(3 / 5)  # of the five judged: the refusal misses
    assert g["tpot_attainment"] == pytest.approx(3 / 5)
    assert g["attainment_all"] == pytest.approx(1 / 5)  # the whole SLA, of the five judged
    assert g["sla_attainment"] == pytest.approx(1 / 4)  # the whole SLA, of the four served
    assert errors_by_type(records) == {"429:rate_limit_exceeded": 1}  # a cut request is not an error
