"""bench/lora_trace.py: the smoke run (CPU, SmolLM2, 1 and 2 adapters) reports every configuration at
every rate, and its adapter runs really ran adapters; the GPU run's defaults are the issue's."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import engine_trace
from bench.engine_trace import TraceRequest
from bench.lora_trace import parse, warm_trace
from tests.bench.smoke_run import run_smoke


def test_the_smoke_run_reports_every_config_and_uses_its_adapters(tmp_path: Path) -> None:
    out = tmp_path / "lora_trace.json"
    rep, printed = run_smoke("bench.lora_trace", out)
    runs = [f"{config}@{rate}" for config in ("base", "adapters_1", "adapters_2") for rate in ("50", "inf")]
    assert sorted(rep["results"]) == sorted(runs)
    for key in runs:
        r = rep["results"][key]
        assert r["output_tokens_per_s"] > 0 and r["tpot_ms_p50"] > 0, key
    # The same trace, EOS ignored, so the same work in every run (none of the smoke trace's six
    # requests carries a JSON schema, whose answer would end with its object).
    assert len({r["output_tokens"] for r in rep["results"].values()}) == 1
    assert sorted(rep["vs_base"]) == sorted(k for k in runs if not k.startswith("base"))
    assert all(ratio["throughput"] > 0 for ratio in rep["vs_base"].values())
    # The adapters ran: both were loaded into slots, and one changes the greedy answer (an engine
    # that ignored adapters would answer as the base model does).
    load = rep["adapter_load"]
    assert load["slot_loads_total"] == 2 and load["resident"] == 2
    assert load["register_s"] > 0 and load["slot_load_ms"] > 0 and load["slot_bytes"] > 0
    effect = rep["adapter_effect"]
    assert effect["differs"] and len(effect["base_tokens"]) == len(effect["adapter_tokens"]) == 16
    assert "adapter load:" in printed.splitlines()[-1]  # the table, printed last


def test_the_gpu_run_defaults_are_the_issues_and_smoke_keeps_explicit_flags() -> None:
    args = parse([])
    assert (args.model, args.random_weights, args.adapters, args.rank) == ("llama-3.1-8b", True, "1,8,64", 16)
    assert args.rates == "20,inf" and args.json is None
    smoke = parse(["--smoke", "--requests", "3", "--out", "x.json"])
    assert (smoke.model, smoke.device, smoke.adapters, smoke.rates) == (
        "smollm2-135m",
        "cpu",
        "1,2",
        "50,inf",
    )
    assert smoke.requests == 3 and smoke.json == Path("x.json")
    assert not engine_trace.parser().parse_args([]).random_weights  # engine_trace's default unchanged


@pytest.mark.parametrize("count", [2, 64])
def test_the_warm_up_has_a_request_per_adapter_with_short_answers(count: int) -> None:
    trace = [TraceRequest(float(i), list(range(100 + i)), 500, {}) for i in range(5)]
    warm = warm_trace(trace, count, output_max=1200)
    assert len(warm) == max(8, count)
    assert all(r.arrival_s == 0.0 and r.output_tokens == 32 for r in warm)
    assert [r.prompt for r in warm[:5]] == [r.prompt for r in trace]  # the trace's shapes first
    assert all(len(r.prompt) == 32 for r in warm[8:])  # then one short request per further adapter
    assert all(r.output_tokens == 16 for r in warm_trace(trace, count, output_max=16))
