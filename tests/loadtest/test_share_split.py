"""Within / over fair share (water-filling on offered work) and the per-group fairness figures, by hand."""

from __future__ import annotations

import pytest

from loadtest.fairness import fairness_report
from loadtest.records import RequestRecord
from loadtest.share_split import attainment_by_share, capacity_cost_per_s, offered_cost, share_split
from loadtest.summary import summarize
from tenancy import SLAClass
from tests.loadtest.trace import rec

FAST = SLAClass(name="interactive", priority_tier=0, ttft_target_s=1.0, tpot_target_s=0.5, e2e_target_s=5.0)
SLOW = SLAClass(name="batch", priority_tier=2, ttft_target_s=10.0, tpot_target_s=1.0, e2e_target_s=60.0)
CLASSES = {"interactive": FAST, "batch": SLOW}


def asked(r: RequestRecord, max_tokens: int = 20) -> RequestRecord:
    r.max_tokens = max_tokens
    return r


def offered() -> list[RequestRecord]:
    """Over 10 s, each request prompt 10 + max_tokens 20 = cost 10 + 2·20 = 50: a (weight 1) 1
    request → 5/s; b (weight 1) 10 → 50/s (one refused, no prompt count); c (weight 2) 4 → 20/s."""
    a = [asked(rec("a", 0.0, (0.5, 0.6)))]
    b = [asked(rec("b", float(i), (i + 2.0, i + 2.1))) for i in range(9)]
    b.append(asked(rec("b", 9.0, (), prompt=0, status="http_error", http_status=429, error="429:queue_full")))
    c = [asked(rec("c", float(i), (i + 0.2, i + 0.3), weight=2.0, sla="batch")) for i in range(4)]
    return a + b + c


def test_offered_cost_charges_a_refused_request_its_tenants_mean_prompt() -> None:
    assert offered_cost(offered()) == {"a": 50.0, "b": 500.0, "c": 200.0}
    # 750 cost units per 15 × 20 = 300 output tokens asked: 20 output tok/s is 50 cost units/s.
    assert capacity_cost_per_s(offered(), 20.0) == pytest.approx(50.0)


def test_water_filling_by_weight_decides_within_and_over() -> None:
    # Capacity 50/s, weights 1, 1, 2: a's 5 and c's 20 fit; b gets the rest, 25 = λ; c's share 2λ = 50.
    split = share_split(offered(), 10.0, 20.0)
    t = split["tenants"]
    assert {k: v["within_share"] for k, v in t.items()} == {"a": True, "b": False, "c": True}
    assert t["b"]["share_per_s"] == pytest.approx(25.0) and t["c"]["share_per_s"] == pytest.approx(50.0)
    assert t["b"]["demand_per_s"] == pytest.approx(50.0)
    assert split["offered_over_capacity"] == pytest.approx(75 / 50)
    assert split["capacity_source"].startswith("given")


def test_every_tenant_is_within_when_the_offer_fits() -> None:
    split = share_split(offered(), 10.0, 40.0)  # capacity 100/s ≥ 75/s offered
    assert all(v["within_share"] and v["share_per_s"] is None for v in split["tenants"].values())


def test_attainment_is_split_by_share_within_a_class() -> None:
    # a (within) meets TTFT; b (over): TTFT 2 s misses the 1 s target; its refusal is excluded from
    # sla_attainment (met / served) but counts in ttft_attainment and attainment_all (of offered).
    recs = offered()
    within = {"a": True, "b": False, "c": True}
    got = attainment_by_share(recs, CLASSES, within, 10.0)
    assert got["interactive"]["within"]["tenants"] == ["a"]
    assert got["interactive"]["within"]["ttft_attainment"] == pytest.approx(1.0)
    assert got["interactive"]["over"]["tenants"] == ["b"]
    assert got["interactive"]["over"]["sla_attainment"] == pytest.approx(0.0)
    assert got["interactive"]["over"]["rejected"] == 1
    assert "over" not in got["batch"]


def test_each_side_has_ttft_tpot_and_whole_sla_attainment_with_its_cut_count_beside() -> None:
    # a (within) gains a request with TPOT 0.6 > 0.5 (TTFT met) and one cut by the drain's cap.
    recs = [
        *offered(),
        rec("a", 1.0, (1.2, 1.8)),
        rec("a", 2.0, (2.1,), status="cut", error="client_deadline"),
    ]
    side = attainment_by_share(recs, CLASSES, {"a": True, "b": False, "c": True}, 10.0)["interactive"][
        "within"
    ]
    assert side["cut"] == 1 and side["requests"] == 3
    assert side["ttft_attainment"] == pytest.approx(1.0)  # of the two judged
    assert side["tpot_attainment"] == pytest.approx(0.5)
    assert side["sla_attainment"] == pytest.approx(0.5) and side["attainment_all"] == pytest.approx(0.5)


def test_summary_carries_the_split_with_the_given_capacity() -> None:
    meta = {"duration_s": 10.0, "scenario": "t", "capacity_output_tps": 20.0}
    s = summarize(offered(), [FAST, SLOW], meta, replica_seconds=10.0, dollars_per_hour=1.0, window_s=2.0)
    assert s["tenants"]["b"]["within_share"] is False and s["tenants"]["a"]["within_share"] is True
    assert s["fair_share"]["capacity_output_tps"] == 20.0
    assert s["attainment_by_share"]["interactive"]["within"]["tenants"] == ["a"]


def test_jain_per_group_mean_and_min_over_windows() -> None:
    # Both busy over [0, 4). Window [0, 2): a 2 + 3·2 = 8, b 0 + 2 = 2 → Jain 100/136;
    # window [2, 4): a 2, b 2 → 1. A third tenant of another weight forms no group.
    a = rec("a", 0.0, (0.5, 1.0, 1.5, 3.0), prompt=2, end=4.0)
    b = rec("b", 0.0, (1.9, 3.5), prompt=0, end=4.0)
    c = rec("c", 0.0, (1.0,), weight=2.0, end=4.0)
    report = fairness_report([a, b, c], 0.0, 4.0, 2.0)
    assert report.jain_backlogged_min == pytest.approx(100 / 136)
    assert report.jain_backlogged_mean == pytest.approx((100 / 136 + 1) / 2)
    group = report.groups["interactive/w1"]
    assert group["tenants"] == ["a", "b"] and group["windows_compared"] == 2
    assert group["jain_min"] == pytest.approx(100 / 136) and group["max_service_gap"] == pytest.approx(6.0)
    assert list(report.groups) == ["interactive/w1"]


def test_share_table_has_a_row_per_class_and_side() -> None:
    from rich.console import Console

    from loadtest.tables import share_table

    meta = {"duration_s": 10.0, "scenario": "t", "capacity_output_tps": 20.0}
    s = summarize(offered(), [FAST, SLOW], meta, replica_seconds=10.0, dollars_per_hour=1.0, window_s=2.0)
    console = Console(width=200, record=True)
    console.print(share_table(s))
    lines = console.export_text().splitlines()
    assert any("interactive" in ln and "within" in ln and " a " in ln for ln in lines)
    assert any("over" in ln and " b " in ln and "9/1/0" in ln for ln in lines)
    assert share_table({"fairness": {}}) is None  # a summary from before the split
