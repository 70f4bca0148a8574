"""Step-model fit, trace scaling, and the files a run writes (read back with the load generator's code)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from loadtest.records import read_records
from loadtest.sim.runner import find_scenario, run_simulation
from loadtest.sim.spec import ClusterSpec, ScaleSpec, SimSpec
from loadtest.sim.step_model import StepModel, StepSample, fit, load_step_model
from loadtest.sim.workload import build_trace


def test_fit_recovers_known_coefficients():
    rng = np.random.default_rng(0)
    truth = StepModel(20.0, 1.5, 0.3, 0.01)
    samples = []
    for _ in range(200):
        b, p, c = int(rng.integers(1, 32)), int(rng.integers(0, 512)), int(rng.integers(0, 8000))
        samples.append(StepSample(b, p, c, truth.step_ms(b, p, c) + rng.normal(0, 0.1)))
    model, stats = fit(samples)
    assert (model.a, model.b, model.c, model.d) == pytest.approx((20.0, 1.5, 0.3, 0.01), rel=0.05)
    assert stats["r2"] > 0.99


def test_shipped_step_models_load_with_provenance():
    for name in ("cpu-smollm2", "h200-llama-3.1-8b"):
        model = load_step_model(name)
        assert model.a > 0
    with pytest.raises(FileNotFoundError, match="shipped"):
        load_step_model("no-such-model")


def test_trace_is_scaled_skewed_and_diurnal():
    scenario = find_scenario("platform")
    scale = ScaleSpec(tenants=200, requests=40_000, diurnal_amplitude=0.5)
    trace = build_trace(scenario, scale, ClusterSpec(replicas=8), load_step_model("h200-llama-3.1-8b"))
    assert abs(len(trace) - 40_000) < 2_000
    assert np.all(np.diff(trace.arrival) >= 0)
    counts = np.bincount(trace.tenant, minlength=200)
    assert counts.max() > 20 * np.median(counts)  # a few heavy tenants, many light
    assert sum(t.weight > 1 for t in trace.tenants) == 2  # heavy_fraction 1 % of 200
    first, second = np.histogram(trace.arrival, bins=2, range=(0, trace.duration_s))[0]
    assert first > 1.3 * second  # sin > 0 in the first half of the cycle
    offered = len(trace) / trace.duration_s
    assert offered == pytest.approx(1.5 * trace.capacity_rps, rel=0.05)


def test_run_writes_records_the_load_generator_reads(tmp_path):
    spec = SimSpec.model_validate(
        {
            "scale": {"tenants": 20, "requests": 2000},
            "cluster": {"replicas": 2},
            "policies": ["fcfs", "fairlane"],
        }
    )
    report = run_simulation(find_scenario("platform"), spec, tmp_path)
    comparison = json.loads((tmp_path / "comparison.json").read_text())
    assert set(comparison["policies"]) == {"fcfs", "fairlane"}
    for name in ("fcfs", "fairlane"):
        records = read_records(tmp_path / name / "records.jsonl")
        assert len(records) == report["requests"]
        ok = [r for r in records if r.ok]
        assert len(ok) == report["policies"][name]["status"]["ok"]
        assert all(r.first_token >= r.sent and r.end >= r.first_token for r in ok)
        loadgen = json.loads((tmp_path / name / "summary.json").read_text())
        assert loadgen["requests_total"] == len(records)
