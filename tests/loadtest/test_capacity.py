"""Capacity sweep: saturation tests on made-up rungs, and one short sweep against a capped server."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from loadtest.capacity import (
    StepResult,
    SweepRule,
    capacity,
    delivered_tps,
    load_scale,
    offered_output_tps,
    run_sweep,
    saturation,
)
from loadtest.records import RequestRecord
from loadtest.scenario import load_scenario
from tests.loadtest.fake_server import CAPPED_HOLD_S

RULE = SweepRule(min_growth=0.1, max_ttft_p99_s=2.0, max_error_fraction=0.01)


def rung(scale: float, tps: float, *, not_ok: int = 0, ttft_p99: float = 0.2) -> StepResult:
    return StepResult(
        scale=scale, offered_rps=scale, requests=100, ok=100 - not_ok, not_ok=not_ok, achieved_rps=tps / 10,
        achieved_tps=tps, ttft_p50_s=0.1, ttft_p99_s=ttft_p99, tpot_p50_s=0.01,
        errors={"429:queue_full": not_ok} if not_ok else {}, client_cpu=0.2,
    )  # fmt: skip


def test_growing_throughput_is_not_saturated() -> None:
    history = [rung(1, 100.0), rung(1.5, 150.0)]
    assert saturation(history, rung(2.25, 220.0), RULE) is None
    assert saturation([], rung(1, 100.0), RULE) is None  # the first rung has nothing to plateau against


def test_plateau_errors_and_ttft_each_saturate() -> None:
    history = [rung(1, 100.0), rung(1.5, 150.0)]
    assert "best 150.0" in saturation(history, rung(2.25, 160.0), RULE)  # grew 7 % for a 50 % larger offer
    assert "not ok" in saturation(history, rung(2.25, 220.0, not_ok=5), RULE)
    assert "429:queue_full 5" in saturation(history, rung(2.25, 220.0, not_ok=5), RULE)
    assert "TTFT p99" in saturation(history, rung(2.25, 220.0, ttft_p99=3.0), RULE)
    assert saturation([], rung(1, 0.0, not_ok=100), RULE) == "no request succeeded"
    empty = replace(rung(1, 0.0), requests=0, ok=0)
    assert saturation([], empty, RULE) is None  # too short a rung for its rate: nothing to judge


def test_capacity_is_the_best_rung_and_says_whether_it_saturated() -> None:
    steps = [rung(1, 100.0), rung(1.5, 150.0), replace(rung(2.25, 140.0), saturated="plateau")]
    cap = capacity(steps)
    assert (cap["capacity_output_tps"], cap["at_scale"], cap["saturated"]) == (150.0, 1.5, True)
    assert cap["saturated_at_scale"] == 2.25
    assert capacity(steps[:2])["saturated"] is False  # the ladder ended first: a lower bound


def test_load_scale_offers_the_factor_in_output_tokens() -> None:
    sc = load_scenario("mixed-sla")
    scale = load_scale(sc, capacity_tps=1000.0, load_factor=1.5)
    assert offered_output_tps(sc.scaled(scale)) == pytest.approx(1500.0)


def test_sweep_against_a_capped_server_stops_at_its_capacity(fake, tmp_path: Path) -> None:
    url, _ = fake
    capacity_rps = 1 / CAPPED_HOLD_S  # 20 requests/s, one at a time
    scenario = {
        "name": "capped", "duration_s": 1.0, "seed": 5,
        "tenants": [{"id": "a", "api_key": "capped", "sla_class": "batch", "rate": 1.0,
                     "prompt": {"kind": "fixed", "tokens": 4}, "output": {"kind": "fixed", "tokens": 2}}],
    }  # fmt: skip
    path = tmp_path / "capped.yaml"
    path.write_text(yaml.safe_dump(scenario))
    rule = SweepRule(scenario=str(path), start_scale=8.0, factor=2.5, max_steps=5, step_duration_s=1.0,
                     step_drain_s=1.0, warmup_fraction=0.0)  # fmt: skip
    result = run_sweep(url, rule, tmp_path / "sweep")
    steps = result["steps"]
    assert result["saturated"] and steps[-1]["saturated"]
    assert 2 <= len(steps) < rule.max_steps  # under capacity first, then stopped before the ladder's end
    assert not any(s["saturated"] for s in steps[:-1])
    assert 0.4 * capacity_rps <= result["capacity_rps"] <= 1.1 * capacity_rps
    assert (tmp_path / "sweep" / "step-0" / "summary.json").exists()


def _record(scheduled: float, token_times: list[float], tokens: int, ok: bool = True, warmup: bool = False):
    return RequestRecord(
        request_id=f"r{scheduled}", tenant="a", sla_class="batch", weight=1.0, scheduled=scheduled,
        sent=scheduled, token_times=token_times, output_tokens=tokens if ok else 0,
        status="ok" if ok else "cancelled", warmup=warmup,
    )  # fmt: skip


def test_window_throughput_counts_the_tokens_that_arrived_while_the_load_was_on() -> None:
    records = [
        _record(0.0, [1.0, 3.0, 5.0], 30, warmup=True),  # 10 tokens a chunk; 2 chunks inside [2, 6]
        _record(2.0, [2.5, 7.0], 8),  # 4 a chunk; one inside
        _record(4.0, [4.5, 5.5, 9.0], 0, ok=False),  # cut: the ok mean, 43 tokens / 6 chunks, for 2
        _record(6.0, [6.5], 5),  # sent last: closes the window at 6.0, its chunk after it
    ]
    # window [2, 6] (first measured send to last send): 2 x 10 + 4 + 2 x 43/6, over 4 s
    assert delivered_tps(records) == pytest.approx((20 + 4 + 2 * 43 / 6) / 4)
    assert delivered_tps(records[:1]) == 0.0  # warm-up only: no window
