"""bench/lora_churn.py: the smoke run (CPU, SmolLM2, 4 slots, 16 adapter names) loads an adapter for
nearly every churn request and none for the resident run, every request finishes, and the report has
its headline; the GPU run's defaults are the issue's."""

from __future__ import annotations

from pathlib import Path

from bench.engine_trace import MIXES, make_trace
from bench.lora_churn import churn_names, headline, parse
from bench.lora_step import adapter_names
from tests.bench.smoke_run import run_smoke


def test_the_smoke_run_loads_for_the_churn_run_only_and_reports_its_headline(tmp_path: Path) -> None:
    out = tmp_path / "lora_churn.json"
    rep, printed = run_smoke("bench.lora_churn", out)
    args = parse(["--smoke"])
    resident, churn = rep["results"]["resident"], rep["results"]["churn"]
    # Every request finished with all its tokens (EOS ignored; n = 2 answers count twice), in both runs.
    trace = make_trace(args, 1000, args.rate)
    expected = sum(r.output_tokens * MIXES[rep["mix"]](r.mixed).get("n", 1) for r in trace)
    assert resident["output_tokens"] == churn["output_tokens"] == expected
    assert sum(t["requests"] for t in churn["ttft_by_tag"].values()) == args.requests
    # The warm-up left a0..a3 in the slots: the resident run loaded nothing and found every adapter in.
    assert resident["slot_loads"] == 0
    assert list(resident["ttft_by_tag"]) == ["resident"]
    # The churn run named 16 adapters in turn through 4 slots: a load for nearly every request.
    assert churn["slot_loads"] >= args.requests - args.slots
    assert churn["ttft_by_tag"]["load"]["requests"] >= args.requests - args.slots
    for r in (resident, churn):
        assert 1 <= r["max_slots_held"] <= args.slots and r["max_running"] >= 1
        assert 0.0 <= r["slots_full_fraction"] <= 1.0 and r["itl_ms_max"] >= r["itl_ms_p99"] > 0
    assert rep["ttft_p99_added_ms"] == churn["ttft_ms_p99"] - resident["ttft_ms_p99"]
    assert set(rep["stall"]) == {"itl_p99_ratio", "tpot_p50_ratio", "itl_ms_max"}
    assert rep["targets"]["ttft_p99_added_ok"] == (rep["ttft_p99_added_ms"] <= 50)
    load = rep["adapter_load"]
    assert load["registered"] == args.registered and load["slot_load_ms"] > 0 and load["peak_rss_gib"] > 0
    assert "TTFT p99 added" in printed.splitlines()[-1]  # the table, printed last


def test_the_churn_order_is_every_name_once_in_a_seeded_order() -> None:
    order = churn_names(500, seed=0)
    assert sorted(order) == sorted(adapter_names(500)) and order != adapter_names(500)
    assert order == churn_names(500, seed=0) != churn_names(500, seed=1)


def test_the_headline_needs_both_runs_and_checks_the_50_ms_target() -> None:
    run = {
        "ttft_ms_p50": 40.0,
        "ttft_ms_p99": 100.0,
        "itl_ms_p99": 20.0,
        "tpot_ms_p50": 10.0,
        "itl_ms_max": 30.0,
    }
    assert headline({"resident": run}) == {}
    late = headline({"resident": run, "churn": run | {"ttft_ms_p99": 160.0, "itl_ms_p99": 22.0}})
    assert late["ttft_p99_added_ms"] == 60.0 and not late["targets"]["ttft_p99_added_ok"]
    assert late["stall"]["itl_p99_ratio"] == 1.1 and late["stall"]["tpot_p50_ratio"] == 1.0
    assert headline({"resident": run, "churn": run | {"ttft_ms_p99": 150.0}})["targets"]["ttft_p99_added_ok"]


def test_the_gpu_run_defaults_are_the_issues_and_smoke_keeps_explicit_flags() -> None:
    args = parse([])
    assert (args.model, args.random_weights, args.slots, args.registered, args.rank) == (
        "llama-3.1-8b", True, 32, 500, 16,
    )  # fmt: skip
    assert (args.rate, args.requests, args.json) == (6.0, 300, None)
    smoke = parse(["--smoke", "--requests", "5", "--out", "x.json"])
    assert (smoke.model, smoke.device, smoke.slots, smoke.registered) == ("smollm2-135m", "cpu", 4, 16)
    assert smoke.requests == 5 and smoke.json == Path("x.json")
