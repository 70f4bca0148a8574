"""``fairlane simulate``: build the trace once, run every policy on it, write the results."""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

from loadtest.scenario import Scenario, load_scenario
from loadtest.sim.output import _json_default, write_policy
from loadtest.sim.simulation import simulate
from loadtest.sim.spec import POLICIES, SimSpec
from loadtest.sim.step_model import load_step_model
from loadtest.sim.summary import summarize
from loadtest.sim.tenants import tenancy_config
from loadtest.sim.workload import build_trace

SIM_SCENARIO_DIR = Path(__file__).parent / "scenarios"


def find_scenario(name_or_path: str) -> Scenario:
    """A path, a simulator scenario (``loadtest/sim/scenarios``) or a load-generator scenario."""
    local = SIM_SCENARIO_DIR / f"{name_or_path}.yaml"
    return load_scenario(local if local.exists() else name_or_path)


def run_simulation(
    scenario: Scenario,
    spec: SimSpec,
    out: Path | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> dict:
    step = load_step_model(spec.cluster.step_model)
    t0 = time.perf_counter()
    trace = build_trace(scenario, spec.scale, spec.cluster, step)
    config = tenancy_config(scenario, trace.tenants, spec.scale, spec.cluster, trace.capacity_rps)
    progress(
        f"trace: {len(trace)} requests, {len(trace.tenants)} tenants, {trace.duration_s:.0f} s simulated,"
        f" capacity ≈ {trace.capacity_rps:.0f} req/s (built in {time.perf_counter() - t0:.1f} s)"
    )
    results = {}
    for name in spec.policies:
        run = simulate(trace, config, POLICIES[name], spec.cluster, step, spec.sample_interval_s)
        summary = summarize(trace, config, run)
        results[name] = summary
        progress(
            f"{name}: {run.wall_s:.1f} s wall, {run.events} events, {summary['throughput_rps']:.1f} ok req/s"
        )
        if out is not None:
            write_policy(out, scenario, trace, run, summary, spec.write_records)
    report = {
        "scenario": scenario.name,
        "spec": spec.model_dump(),
        "step_model": step.as_dict() | {"name": step.name},
        "requests": len(trace),
        "tenants": len(trace.tenants),
        "simulated_s": trace.duration_s,
        "capacity_rps_estimate": trace.capacity_rps,
        "machine": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "wall_s": time.perf_counter() - t0,
        "policies": results,
    }
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "comparison.json").write_text(json.dumps(report, indent=1, default=_json_default))
    return report
