"""Sizes, times and scenarios of the cluster benchmark (``loadtest.device_cluster_run``)."""

from __future__ import annotations

from dataclasses import dataclass
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


def at_load(name: str, scale: float, plan: Plan, model: str) -> Scenario:
    sc = load_scenario(name).scaled(scale, plan.scenario_s)
    updates = {"model": model, "drain_timeout_s": plan.scenario_drain_s, "max_requests": 1_000_000}
    return Scenario.model_validate(sc.model_dump() | updates | {"max_in_flight": plan.max_in_flight})
