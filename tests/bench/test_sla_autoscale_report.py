"""bench/sla_autoscale_report.py: the decisions, scale-up waits and the prediction's error of a run."""

from __future__ import annotations

import pytest

from bench import sla_autoscale_report as report
from loadtest.records import RequestRecord
from tenancy import SLAClass

INTERACTIVE = SLAClass(
    name="interactive", priority_tier=0, ttft_target_s=1.0, tpot_target_s=0.1, e2e_target_s=30.0
)


def _record(i: int, at: float, ttft: float, status: str = "ok", http: int | None = 200) -> RequestRecord:
    return RequestRecord(
        request_id=str(i), tenant="alice", sla_class="interactive", weight=1.0, scheduled=at, sent=at,
        first_token=at + ttft, end=at + ttft + 0.5, output_tokens=11, max_tokens=11, status=status,
        http_status=http,
    )  # fmt: skip


def _decision(at: float, current: int, desired: int, predicted: float) -> dict:
    return {
        "decided_at": at, "current": current, "desired": desired,
        "reason": "up: x" if desired > current else "hold",
        "replica_start_s": {"r1": 5.0},
        "predictions": [{"replicas": desired, "attainment": {"interactive": predicted}},
                        {"replicas": desired + 1, "attainment": {"interactive": 1.0}}],
    }  # fmt: skip


def test_each_decision_is_judged_on_the_arrivals_of_its_horizon_at_the_count_it_chose() -> None:
    # 100 arrivals over 0..10 s: those before 5 s meet the 1-s TTFT target, those after miss it.
    records = [_record(i, i * 0.1, 0.2 if i < 50 else 2.0) for i in range(100)]
    records.append(_record(100, 1.0, 5.0, status="cut", http=None))  # cut by the client: left out
    records.append(_record(101, 1.0, 5.0, status="http_error", http=429))  # refused: left out
    seen = report.arrivals(records, started_wall=1000.0, targets={"interactive": INTERACTIVE})
    assert len(seen) == 100
    # Sampled three times, two decisions; horizon = the published start (5 s) + 5 s.
    samples = [{"decision": _decision(1000.0, 1, 1, 0.9)}, {"decision": _decision(1000.0, 1, 1, 0.9)},
               {"decision": _decision(1005.0, 1, 2, 0.4)}, {}]  # fmt: skip
    made = report.decisions(samples)
    assert [d["decided_at"] for d in made] == [1000.0, 1005.0]
    rows = report.prediction_errors(made, seen, "interactive", start_time_s=60.0, horizon=5.0)
    # The second decision (t = 5 s) also predicts for the request still waiting for its first token
    # then: #49, sent at 4.9 s, first token at 5.1 s, within its target.
    assert [a.waiting_at(1005.0) for a in seen].count(True) == 1
    got = [(r["predicted"], r["observed"], r["requests"]) for r in rows]
    assert got == [(0.9, 0.5, 100), (0.4, pytest.approx(1 / 51), 51)]
    summary = report.error_summary(rows)
    assert summary["mean_abs_error"] == pytest.approx((0.4 + 0.4 - 1 / 51) / 2)
    # split by the phase each decision was made in (the first before the change, the second at it)
    by_phase = report.error_by_phase(rows, {"before": (1000.0, 1005.0), "burst": (1005.0, 1010.0)})
    assert by_phase["before"]["mean_error"] == pytest.approx(0.4) and by_phase["before"]["decisions"] == 1
    assert (
        by_phase["burst"]["mean_error"] == pytest.approx(0.4 - 1 / 51) and by_phase["burst"]["decisions"] == 1
    )
    assert report.error_by_phase(rows, {"after": (2000.0, 2010.0)})["after"]["decisions"] == 0


def test_a_change_seen_only_as_last_change_counts_and_a_repeated_one_counts_once() -> None:
    up = _decision(12.0, 1, 3, 0.5)
    hold = _decision(20.0, 3, 3, 1.0) | {"last_change": up}  # the up's own sample was shed
    downs = [_decision(40.0 + i, 3, 1, 1.0) for i in range(3)]  # repeated until Serve's delay passes
    samples = [{"decision": _decision(10.0, 1, 1, 1.0)}, {"state_error": "shed"}, {"decision": hold}]
    samples += [{"decision": d | {"last_change": d}} for d in downs]
    made = report.decisions(samples)
    assert [d["decided_at"] for d in made] == [10.0, 12.0, 20.0, 40.0, 41.0, 42.0]
    changes = report.count_changes(made)
    assert [(c["decided_at"], c["current"], c["desired"]) for c in changes] == [(12.0, 1, 3), (40.0, 3, 1)]


def test_scale_ups_are_timed_from_the_decision_to_serve_running_that_many() -> None:
    made = [_decision(10.0, 1, 1, 1.0), _decision(12.0, 1, 3, 0.5), _decision(40.0, 3, 1, 1.0)]
    changes = report.count_changes(made)
    assert [(c["current"], c["desired"]) for c in changes] == [(1, 3), (3, 1)]
    counts = [(11.0, 1), (20.0, 2), (31.5, 3), (32.0, 3), (50.0, 1)]
    samples = [{"t": t, "running": n} for t, n in counts]
    timeline = report.running_timeline(samples)
    assert timeline == [(11.0, 1), (20.0, 2), (31.5, 3), (50.0, 1)]
    assert report.scale_up_waits(changes, timeline) == [{"decided_at": 12.0, "to": 3, "ready_after_s": 19.5}]


def test_attainment_per_phase_counts_only_its_own_span() -> None:
    seen = [report.Arrival("interactive", t, t < 5) for t in range(10)] + [
        report.Arrival("batch", 1.0, False)
    ]
    phases = report.phase_attainment(seen, {"a": (0, 5), "b": (5, 10), "c": (10, 20)}, "interactive")
    assert phases == {
        "a": {"requests": 5, "attainment": 1.0},
        "b": {"requests": 5, "attainment": 0.0},
        "c": {"requests": 0, "attainment": None},
    }


def test_the_burst_rate_sets_daves_rate_and_the_phases_set_its_span() -> None:
    from bench.sla_autoscale_run import GPU, scenario

    sc = scenario(GPU, one_replica_rps=10.0, burst_rate=0.8)
    rates = {t.id: t.rate for t in sc.tenants}
    assert rates == {"alice": pytest.approx(4.0), "dave": pytest.approx(8.0)}
    before, burst, after = GPU.phases_s
    dave = next(t for t in sc.tenants if t.id == "dave")
    assert (dave.start_s, dave.end_s) == (before, before + burst)
    assert sc.duration_s == before + burst + after
    assert {t.id: t.rate for t in scenario(GPU, 10.0).tenants}["dave"] == pytest.approx(20.0)  # default 2.0
