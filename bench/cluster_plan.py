"""Sizes, times and scenarios of the cluster benchmark (``bench.cluster_run``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from loadtest.capacity import SweepRule
from loadtest.scenario import FixedLength, Scenario, TenantLoad, load_scenario
from loadtest.serve_process import REPO_ROOT
from tenancy import DEMO_KEYS

CONFIGS = REPO_ROOT / "loadtest" / "configs"
TENANTS = (("alice", "interactive", 2.0), ("bob", "standard", 1.0), ("carol", "batch", 1.0))


@dataclass(frozen=True)
class Plan:
    """Sizes and times of one benchmark run."""

    config: Path
    budget_s: float  # the whole run, cluster start included; later phases are skipped past it
    per_tenant: int  # closed-loop requests per tenant in the overhead runs (three tenants)
    prompt_words: int
    output_tokens: int
    overhead_s: float
    sweep: SweepRule
    start_fraction: float  # first rung at this share of the engine-alone capacity estimate
    scenarios: tuple[str, ...] = ("noisy-neighbour", "mixed-sla")
    load_factor: float = 1.5
    scenario_s: float = 40.0
    scenario_drain_s: float = 15.0
    max_in_flight: int = 4096
    ready_timeout_s: float = 300.0
    replicas: tuple[int, ...] = (1,)  # one cluster per count, in order; the scenarios run on the last
    engine_estimate_tps: float | None = None  # given: no engine-alone run, this is its throughput
    start_tps: float | None = None  # given: the first count's first rung, output tok/s per replica
    routers_per_replica: int = 0  # > 0: num_routers = this × the replica count (0: the config's)
    answer_scale: float = 1.0  # the scenarios' answer lengths × this (GPU-length answers: ~16)
    capacity_tps: float | None = None  # given: no sweep, the scenarios run at load_factor × this
    # Budget guesses for the phases still to come, so an earlier sweep leaves them their time.
    ready_estimate_s: float = 60.0  # cluster start until /health, plus warm-up
    stop_estimate_s: float = 15.0
    min_rungs: int = 3  # rungs kept for each later replica count's sweep
    # A later count's first rung: this share of (count / earlier count) × the earlier capacity, so
    # two replicas do not climb again through the rungs one replica already served.
    rescale_start: float = 0.5

    def rung_s(self) -> float:
        return self.sweep.step_duration_s + self.sweep.step_drain_s + 2

    def scenarios_s(self) -> float:
        return len(self.scenarios) * (self.scenario_s + self.scenario_drain_s + 4)

    def reserve_after_sweep(self, index: int) -> float:
        """Seconds the phases after the sweep of ``replicas[index]`` need: stops, later counts, scenarios."""
        later = len(self.replicas) - 1 - index
        one_count = self.ready_estimate_s + self.min_rungs * self.rung_s() + self.stop_estimate_s
        return self.stop_estimate_s + later * one_count + self.scenarios_s()


# GPU: 3 × 32 = 96 requests in flight for the overhead runs, under the router's room (128) and
# each tenant under its reserved-room cap (96), so nothing waits in the fair queue: the two sides
# differ by the path only. The sweep's first rung is a quarter of what the engine alone suggests.
GPU = Plan(
    config=CONFIGS / "gpu-8b.yaml",
    budget_s=480.0,
    per_tenant=32,
    prompt_words=128,
    output_tokens=128,
    overhead_s=20.0,
    sweep=SweepRule(start_scale=20.0, factor=1.5, max_steps=8, step_duration_s=12.0, step_drain_s=6.0,
                    max_in_flight=4096),
    start_fraction=0.25,
)  # fmt: skip
SMOKE = Plan(
    config=CONFIGS / "cpu-smoke.yaml",
    budget_s=900.0,
    per_tenant=1,
    prompt_words=16,
    output_tokens=8,
    overhead_s=8.0,
    sweep=SweepRule(start_scale=0.5, factor=2.0, max_steps=4, step_duration_s=10.0, step_drain_s=8.0,
                    max_ttft_p99_s=8.0, max_in_flight=256),
    start_fraction=0.25,
    scenario_s=10.0,
    scenario_drain_s=10.0,
    max_in_flight=256,
)  # fmt: skip


# Two GPUs, one and then two replicas, in a 330 s budget (about 7 minutes of device time with the
# machine's start): the engine-alone figure comes from the one-GPU run (--engine-estimate-tps),
# the sweeps start low with short rungs, the scenarios run once, on two replicas.
GPU_X2 = replace(
    GPU,
    budget_s=330.0,
    overhead_s=12.0,
    sweep=GPU.sweep.model_copy(update={"step_duration_s": 8.0, "step_drain_s": 4.0}),
    start_fraction=0.2,
    scenario_s=25.0,
    scenario_drain_s=10.0,
    replicas=(1, 2),
    ready_estimate_s=55.0,
    stop_estimate_s=10.0,
)
# The same phases on the CPU: both replicas share the box's cores, so the "scaling" means nothing.
SMOKE_X2 = replace(
    SMOKE,
    budget_s=330.0,
    overhead_s=6.0,
    sweep=SMOKE.sweep.model_copy(update={"step_duration_s": 6.0, "step_drain_s": 4.0, "max_steps": 3}),
    scenario_s=8.0,
    scenario_drain_s=6.0,
    replicas=(1, 2),
    ready_estimate_s=40.0,
    stop_estimate_s=10.0,
    min_rungs=2,
)


def effective_config(path: Path, workdir: Path) -> Path:
    """The app config with its tenancy path made absolute (Serve actors do not run in this folder)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if data.get("tenancy_config"):
        data["tenancy_config"] = str((REPO_ROOT / data["tenancy_config"]).resolve())
    out = workdir / "app.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return out


def closed_loop(plan: Plan, model: str) -> Scenario:
    """Three tenants × ``per_tenant`` requests in flight, all of one shape, on the completions route."""
    shape = {
        "prompt": FixedLength(tokens=plan.prompt_words),
        "output": FixedLength(tokens=plan.output_tokens),
    }
    tenants = [
        TenantLoad(id=t, api_key=DEMO_KEYS[t], sla_class=c, weight=w, concurrency=plan.per_tenant, **shape)
        for t, c, w in TENANTS
    ]
    return Scenario(
        name="closed-loop", model=model, endpoint="completions", duration_s=plan.overhead_s,
        warmup_s=plan.overhead_s * 0.2, seed=7, drain_timeout_s=30.0, max_requests=1_000_000,
        max_in_flight=plan.max_in_flight, tenants=tuple(tenants),
    )  # fmt: skip


def with_answer_scale(scenario: Scenario, factor: float) -> Scenario:
    """Every tenant's answer lengths × ``factor`` (at least one token): the scenario's shape with
    answers as long as a GPU serves, so its rate at a multiple of capacity stays within what the
    routers pass (the shipped scenarios are sized for the CPU default's 24-token answers)."""
    if factor == 1.0:
        return scenario

    def longer(spec: dict) -> dict:
        keys = ("tokens",) if spec["kind"] == "fixed" else ("min", "max")
        return spec | {k: max(1, round(spec[k] * factor)) for k in keys}

    data = scenario.model_dump()
    data["tenants"] = [t | {"output": longer(t["output"])} for t in data["tenants"]]
    return Scenario.model_validate(data)


def at_load(name: str, scale: float, plan: Plan, model: str) -> Scenario:
    """Scenario ``name`` with the plan's answer lengths at ``scale`` (see ``load_scale_for``)."""
    sc = with_answer_scale(load_scenario(name), plan.answer_scale).scaled(scale, plan.scenario_s)
    updates = {"model": model, "drain_timeout_s": plan.scenario_drain_s, "max_requests": 1_000_000}
    return Scenario.model_validate(sc.model_dump() | updates | {"max_in_flight": plan.max_in_flight})
