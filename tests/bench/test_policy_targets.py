"""The dispatch-policy benchmark's targets, table and plan (bench/policy_*.py), on hand-made figures."""

from __future__ import annotations

from dataclasses import replace

import pytest
from rich.console import Console

from bench.policy_plan import GPU, at_capacity, solo_of
from bench.policy_run import parser, pick_plan
from bench.policy_schedule import build_schedule, drain_cap_s
from bench.policy_table import cell, policy_table
from bench.policy_targets import (
    mixed_rows,
    noisy_rows,
    over_share_jain,
    quiet_split,
    quiet_ttft_p99,
    target_rows,
)
from loadtest.capacity import offered_output_tps
from loadtest.plan import build_open_plan
from tests.loadtest.trace import rec


def tenant(cls: str, within: bool, p99: float = 0.5, att: float = 1.0) -> dict:
    return {"sla_class": cls, "within_share": within, "ttft_s": {"p99": p99}, "attainment_all": att,
            "output_throughput_tps": 100.0}  # fmt: skip


def noisy_run(quiet_p99: float, within_ttft: float, jains: tuple[float, float]) -> dict:
    """A compact summary: alice/dave within share (interactive), carol/erin over (batch)."""
    within = {"alice": True, "dave": True, "carol": False, "erin": False}
    groups = {
        "batch/w1": {"tenants": ["carol", "erin"], "jain_mean": jains[0], "jain_min": jains[1]},
        "interactive/w2": {"tenants": ["alice", "dave"], "jain_mean": 0.5, "jain_min": 0.1},
    }
    return {
        "tenants": {t: tenant("batch" if not w else "interactive", w) for t, w in within.items()},
        "fair_share": {"tenants": {t: {"within_share": w} for t, w in within.items()}},
        "fairness": {"groups": groups, "jain_backlogged_mean": 0.7},
        "attainment_by_share": {
            "interactive": {
                "within": {
                    "ttft_attainment": within_ttft,
                    "tpot_attainment": 0.9,
                    "attainment_all": 0.8,
                    "cut": 2,
                }
            }
        },
        "overall": {"cut": 5},
        "quiet_ttft_p99_s": quiet_p99,
        "meta": {
            "drain": {"waited_s": 12.5, "seconds": 60.0},
            "client_loop_lag_ms": {"p99_ms": 56.8},
            "router_loop_lag_ms": {"p99_ms": 22.0},
            "client_gc": {"max_ms": 3.5},
            "router_gc": {"max_ms": 180.0},
            "replica_gc": {"r1": {"max_ms": 4.0}, "r2": {"max_ms": 9.0}},
            "replica_profiles": {
                "r1": {"device_busy_fraction": 0.99, "hold_ms": {"mean": 3.0}, "gap_ms": {"mean": 0.1}},
                "r2": {"device_busy_fraction": 0.97, "hold_ms": {"mean": 1.0}, "gap_ms": {"mean": 0.3}},
            },
        },
        "quiet_split": {
            "router_ttft_p99_s": 0.1,
            "client_extra_p50_s": 0.02,
            "client_extra_p99_s": 0.15,
            "entry_p99_s": 0.01,
            "queue_p99_s": 0.02,
            "engine_ttft_p99_s": 0.05,
            "transit_p99_s": 0.03,
        },
    }


def test_noisy_targets_per_policy() -> None:
    runs = {"fairlane": noisy_run(0.6, 1.0, (0.995, 0.991)), "fcfs": noisy_run(3.0, 0.5, (0.999, 0.98))}
    rows = {r.label: r for r in noisy_rows("nn", runs, solo_p99=0.5)}
    ratio = rows["quiet TTFT p99 ÷ solo"]
    assert ratio.values == pytest.approx({"fairlane": 1.2, "fcfs": 6.0})
    assert ratio.met == {"fairlane": True, "fcfs": False}
    assert rows["interactive TTFT attainment, within share"].met == {"fairlane": True, "fcfs": False}
    # TPOT and the whole SLA apart, for context, and what the drain's cap cut beside them
    assert rows["interactive TPOT attainment, within share"].values["fairlane"] == 0.9
    assert rows["interactive whole SLA (TTFT, TPOT, E2E) attainment, within share"].values["fcfs"] == 0.8
    assert rows["interactive within share: cut (in none of the three)"].values["fairlane"] == 2
    assert rows["requests cut by the client's deadline (in no attainment)"].values["fcfs"] == 5
    assert rows["drain after the load (every admitted request to its end)"].values["fairlane"] == 12.5
    # Jain over the over-share group only (the quiet pair's 0.5 is their own demand's).
    assert rows["Jain, backlogged over-share group (mean)"].met == {"fairlane": True, "fcfs": True}
    assert rows["Jain, backlogged over-share group (min)"].values["fcfs"] == pytest.approx(0.98)
    assert rows["Jain, backlogged over-share group (min)"].met == {"fairlane": True, "fcfs": False}
    assert over_share_jain(runs["fairlane"]) == (0.995, 0.991)
    assert rows["Jain, every group of ≥ 2 incl. within-share (mean)"].met == {}  # context only
    # whether the measurement kept up: the load generator's loop, then the router's
    assert rows["load generator's loop lag p99 (its latencies grow with it)"].values["fairlane"] == 56.8
    assert rows["router's loop lag p99"].values["fcfs"] == 22.0
    # where the quiet TTFT goes: the router's own, then what the client saw beyond it
    assert rows["quiet TTFT p99 at the router (arrival → first token)"].values["fairlane"] == 0.1
    assert rows["quiet: client TTFT − router TTFT, p99"].values["fcfs"] == 0.15
    assert rows["quiet p99: router app entry → arrival"].values["fairlane"] == 0.01
    assert rows["quiet p99: arrival → dispatch"].values["fairlane"] == 0.02
    assert rows["quiet p99: engine arrival → first token"].values["fcfs"] == 0.05
    assert rows["quiet p99: dispatch → first token, less the engine's"].values["fcfs"] == 0.03
    assert rows["router's longest GC pause"].values["fairlane"] == 180.0
    assert rows["load generator's longest GC pause"].values["fcfs"] == 3.5
    assert rows["replicas' longest GC pause (since start)"].values["fcfs"] == 9.0
    # the engine's side, averaged over the replicas' last polled step profiles
    assert rows["replicas' step profile (last polled): device busy"].values["fairlane"] == pytest.approx(0.98)
    held = rows["replicas' step profile (last polled): held for arrivals per step, mean (late launch)"]
    assert held.values["fcfs"] == pytest.approx(2.0)
    assert rows["replicas' step profile (last polled): device idle before a step, mean"].values[
        "fairlane"
    ] == pytest.approx(0.2)


def test_noisy_targets_without_solo_or_groups_are_undecided() -> None:
    run = noisy_run(0.6, 1.0, (0.995, 0.991)) | {"fairness": {"groups": {}}}
    rows = {r.label: r for r in noisy_rows("nn", {"fairlane": run}, solo_p99=None)}
    assert rows["quiet TTFT p99 ÷ solo"].met == {"fairlane": None}
    assert rows["Jain, backlogged over-share group (mean)"].met == {"fairlane": None}


def test_mixed_sla_interactive_met_and_batch_absorbs() -> None:
    def run(i: float, b: float) -> dict:
        inter = {"attainment_all": i, "ttft_attainment": i, "tpot_attainment": 1.0}
        return {"classes": {"interactive": inter, "batch": {"attainment_all": b}}, "tenants": {},
                "overall": {"cut": 3}}  # fmt: skip

    rows = {r.label: r for r in mixed_rows("m", {"fairlane": run(0.995, 0.6), "fcfs": run(0.7, 0.9)})}
    assert rows["interactive SLA attainment"].met == {"fairlane": True, "fcfs": False}
    assert rows["interactive TPOT attainment"].values == {"fairlane": 1.0, "fcfs": 1.0}
    assert rows["requests cut by the client's deadline (in no attainment)"].values["fcfs"] == 3
    absorbs = rows["batch absorbs the loss (interactive met, batch ≤ interactive)"]
    assert absorbs.met == {"fairlane": True, "fcfs": False}


def test_table_prints_every_policy_with_met_or_missed() -> None:
    results = {
        "policies_run": ["fairlane", "fcfs"],
        "runs": {"fairlane": {"noisy-neighbour-pairs": {"summary": noisy_run(0.6, 1.0, (0.995, 0.991)),
                                                        "quiet_ttft_p99_s": 0.6}},
                 "fcfs": {"noisy-neighbour-pairs": {"skipped": "10s of the budget left"}}},
        "solo": {"quiet_ttft_p99_s": 0.5},
        "skipped": [{"phase": "fcfs/noisy-neighbour-pairs", "why": "10s of the budget left"}],
        "notes": [],
    }  # fmt: skip
    # 9 targets and context, 3 of the quiet split, 2 loop lags, 3 collectors, 3 of the engine, 2 of the
    # drain, 3 per tenant
    assert len(target_rows(results)) == 26 + 3 * 4
    console = Console(width=200, record=True)
    console.print(policy_table(results))
    text = console.export_text()
    assert "1.20× met" in text and "fcfs" in text
    assert any(
        "skipped" in ln and "fcfs/noisy-neighbour-pairs" in ln and "10s of the" in ln
        for ln in text.splitlines()
    )
    assert cell(None, "%", None) == "-" and cell(0.5, "%", False) == "50.0% missed"


def test_quiet_ttft_p99_pools_quiet_tenants_and_skips_warmup() -> None:
    a, b, noisy = rec("a", 0.0, (0.1,)), rec("b", 0.0, (0.3,)), rec("carol", 0.0, (9.0,))
    warm = rec("a", 0.0, (5.0,))
    warm.warmup = True
    assert quiet_ttft_p99([a, b, noisy, warm], ["a", "b"]) == pytest.approx(0.1 + 0.99 * 0.2)


def test_scenarios_offer_the_load_factor_and_solo_keeps_the_quiet_arrivals() -> None:
    sc = at_capacity("noisy-neighbour-pairs", GPU, "llama-3.1-8b")
    assert offered_output_tps(sc) == pytest.approx(1.5 * 13839.0)
    assert sc.duration_s == GPU.duration_s and sc.tenants[0].output.tokens == 24 * 20
    solo = solo_of(sc)
    assert [t.id for t in solo.tenants] == ["alice", "dave", "bob"]
    quiet = [(p.tenant, p.at, p.max_tokens) for p in build_open_plan(sc) if p.tenant not in ("carol", "erin")]
    assert quiet == [(p.tenant, p.at, p.max_tokens) for p in build_open_plan(solo)]


def test_options_make_the_plan() -> None:
    args = parser().parse_args(["--out", "x", "--policies", "fcfs,fairlane", "--capacity-tps", "1000"])
    plan = pick_plan(args)
    assert plan.ordered_policies() == ("fairlane", "fcfs") and plan.capacity_tps == 1000.0
    with pytest.raises(SystemExit):
        pick_plan(parser().parse_args(["--out", "x", "--policies", "lifo"]))


def test_quiet_split_matches_client_records_to_the_routers_by_response_id() -> None:
    def served(tenant: str, sent: float, first: float, server_id: str | None, warmup: bool = False):
        r = rec(tenant, sent=sent, tokens=(first,), end=first + 1)
        r.server_id, r.warmup = server_id, warmup
        return r

    records = [
        served("a", 0.0, 0.30, "chatcmpl-r1"),  # client TTFT 0.30, router 0.10: 0.20 beyond it
        served("b", 1.0, 1.05, "cmpl-r2"),  # 0.05 and 0.04: 0.01 beyond
        served("noisy", 2.0, 9.0, "chatcmpl-r3"),  # not a quiet tenant
        served("a", 3.0, 3.5, "chatcmpl-r4", warmup=True),  # warm-up: not measured
        served("b", 4.0, 4.2, None),  # no response id: cannot be matched
    ]
    router_ttfts = {"r1": 0.10, "r2": 0.04, "r3": 0.5, "r4": 0.1}
    timings = {"records": [{"request_id": rid, "ttft": t} for rid, t in router_ttfts.items()]}
    # r1 also has the finer stamps: entry 0.01, queue 0.02, engine 0.05, transit 0.10-0.02-0.05
    timings["records"][0] |= {"received": 9.99, "arrival": 10.0, "dispatched": 10.02, "first_token": 10.1,
                              "engine_ttft": 0.05}  # fmt: skip
    split = quiet_split(records, timings, ["a", "b"])
    assert split["matched"] == 2
    assert split["entry_p50_s"] == pytest.approx(0.01) and split["queue_p99_s"] == pytest.approx(0.02)
    assert split["engine_ttft_p50_s"] == pytest.approx(0.05)
    assert split["transit_p99_s"] == pytest.approx(0.1 - 0.02 - 0.05)
    assert split["router_ttft_p99_s"] == pytest.approx(0.04 + 0.99 * 0.06)
    assert split["client_extra_p50_s"] == pytest.approx((0.20 + 0.01) / 2)
    assert split["client_extra_p99_s"] == pytest.approx(0.01 + 0.99 * 0.19)
    assert quiet_split(records, None, ["a"])["matched"] == 0  # a run folder without server timings


def test_the_gpu_plan_runs_both_scenarios_under_all_three_policies_within_nine_minutes() -> None:
    """The schedule's estimates (start ~75 s, redeploys ~40 s, each run its load + full drain) fit 540 s
    with nothing left out; at 40 s of load they would not, and the solo run then goes first, then the
    last policy's runs backwards, its redeploy with them; every drop says why."""
    schedule = build_schedule(GPU)
    labels = [p.label for p in schedule.phases]
    assert schedule.skipped == () and schedule.total_s() <= 540.0
    assert (
        len([p for p in schedule.phases if p.kind == "run"]) == 6 and "solo/noisy-neighbour-pairs" in labels
    )
    assert labels[0] == "start (fairlane)" and labels[-1] == "stop" and labels.count("redeploy (vtc)") == 1
    longer = build_schedule(replace(GPU, duration_s=40.0))
    assert [label for label, _ in longer.skipped] == [
        "solo/noisy-neighbour-pairs", "fcfs/mixed-sla", "fcfs/noisy-neighbour-pairs", "redeploy (fcfs)"
    ]  # fmt: skip
    assert longer.total_s() <= 540.0 and "budget" in longer.skipped[0][1]


def test_a_runs_drain_is_planned_from_its_backlog_and_capped_by_what_later_phases_need() -> None:
    sc = at_capacity("mixed-sla", GPU, "m")
    # 1.5x capacity: half the load's length in backlog (x 1.25 slack), then 960 tokens at 12 ms
    assert GPU.drain_estimate_s(sc) == pytest.approx(0.5 * 20.0 * 1.25 + 960 * 0.012)
    assert GPU.drain_estimate_s(solo_of(at_capacity("noisy-neighbour-pairs", GPU, "m"))) == pytest.approx(
        480 * 0.012
    )
    schedule = build_schedule(GPU)
    last = next(p for p in schedule.phases if p.label == "fcfs/mixed-sla")
    assert drain_cap_s(GPU, schedule, last, sc, left_s=200.0) == pytest.approx(200.0 - 20.0 - 10.0 - 15.0)
    assert drain_cap_s(GPU, schedule, last, sc, left_s=10.0) == pytest.approx(GPU.drain_estimate_s(sc))
    assert drain_cap_s(replace(GPU, drain_cap_s=8.0), schedule, last, sc, left_s=200.0) == 8.0


def test_a_synthetic_tokenizer_run_sends_the_mix_without_json_schemas() -> None:
    """Random weights' word tokenizer cannot constrain output: the replica refuses a JSON schema, so
    the GPU plan's runs leave them out; a real tokenizer's config keeps the whole mix."""
    assert at_capacity("mixed-sla", GPU, "m").sampling == "mix_without_schemas"
    real = replace(GPU, config=GPU.config.parent / "cpu-fair.yaml")
    assert at_capacity("mixed-sla", real, "m").sampling == "mix"
