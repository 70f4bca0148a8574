"""Sizes, times and traces of the dispatch-policy benchmark (``bench.policy_run``, issue 23)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.cluster_plan import CONFIGS, with_answer_scale
from cluster.config import load_app_config
from loadtest.capacity import load_scale, offered_output_tps
from loadtest.scenario import FixedLength, Scenario, load_scenario
from tenancy import DISPATCH_POLICIES

NOISY_SCENARIO = "noisy-neighbour-pairs"
# The tenants each scenario floods with: the solo run is the same trace without them.
NOISY_TENANTS = {"noisy-neighbour-pairs": ("carol", "erin"), "noisy-neighbour": ("carol",)}
SOLO = "solo"


@dataclass(frozen=True)
class PolicyPlan:
    """Sizes and times of one run; every scenario runs at ``load_factor`` × ``capacity_tps``.

    A run is its load (``duration_s``), then its drain: every request it admitted, to its end
    (``loadtest/drain.py``). At 1.5 × capacity the load leaves a backlog of about half its length in
    work, so the drain is planned as that backlog served at the capacity (× ``drain_slack``) plus
    the longest answer at ``tpot_estimate_s``; ``bench/policy_schedule.py`` fits the runs to the
    budget with these estimates and caps each drain so that the phases after it keep theirs.
    """

    config: Path
    capacity_tps: float  # the cluster's output tok/s with the sampling mix (an earlier sweep's)
    budget_s: float  # the whole run, cluster start included; what does not fit is skipped and said
    duration_s: float  # seconds of load per scenario run (the scenario's warm-up keeps its share)
    answer_scale: float  # answer lengths × this (GPU: answers a GPU serves, tens of requests/s)
    window_s: float  # fairness window (Jain, service gap)
    tpot_estimate_s: float  # seconds per output token at the end of a drain (the last answers' pace)
    policies: tuple[str, ...] = ("fairlane", "vtc", "fcfs")
    scenarios: tuple[str, ...] = (NOISY_SCENARIO, "mixed-sla")
    load_factor: float = 1.5
    max_in_flight: int = 4096
    settings: tuple[tuple[str, Any], ...] = ()  # AppConfig overrides (``--set``), e.g. direct ingress
    # Load generator processes: one reading ~13,000 streamed tok/s lagged 57 ms at p99 (issue 23's run).
    client_procs: int = 1
    drain_cap_s: float | None = None  # a cap on every drain (``--drain-s``); None: the budget's only
    # Budget guesses for the phases (H200, 2026-12-03: cluster up after 72 s, redeploys 31 and 35 s,
    # ~10 s a run beyond load and drain: the wait for an idle router, the shards' 5-s spawn lead, files).
    start_estimate_s: float = 75.0  # Ray, Serve, the first replica with the model, one warm-up request
    redeploy_estimate_s: float = 40.0  # new routers and replica (the model loads again)
    run_overhead_s: float = 10.0
    drain_slack: float = 1.25  # a backlog drains below the sweep's capacity (long prompts, a thinning batch)
    settle_s: float = 10.0  # between runs, at most: until the router holds nothing (wait_idle)
    stop_estimate_s: float = 15.0

    def ordered_policies(self) -> tuple[str, ...]:
        """fairlane first (its cluster start serves the solo run too and the targets are its)."""
        return tuple(sorted(self.policies, key=lambda p: p != "fairlane"))

    def drain_estimate_s(self, sc: Scenario) -> float:
        """The expected drain: the load's backlog at the capacity, then the longest answer."""
        over = max(0.0, offered_output_tps(sc) / self.capacity_tps - 1.0)
        return over * sc.duration_s * self.drain_slack + longest_answer(sc) * self.tpot_estimate_s

    def run_estimate_s(self, sc: Scenario) -> float:
        return sc.duration_s + self.drain_estimate_s(sc) + self.run_overhead_s


# 20 s of load: the six runs, the solo run, the cluster start and two redeploys fit 540 s with the
# drains (bench/policy_schedule.py estimates ~513 s); 40 s of load with full drains would take ~730 s.
GPU = PolicyPlan(
    config=CONFIGS / "gpu-8b.yaml",
    capacity_tps=13839.0,
    budget_s=540.0,
    duration_s=20.0,
    answer_scale=20.0,  # 480-token answers: noisy-neighbour-pairs at 1.5x sends ~43 requests/s
    window_s=5.0,
    tpot_estimate_s=0.012,  # TPOT p99 8-11 ms at 128 sequences (BENCHMARKS.md); fewer at the drain's end
    client_procs=4,
)
# SmolLM2 random weights on a 2-core CPU (max_num_seqs 4): about 20 output tokens per second.
# Half-length answers give twice the requests (~2.5/s), so each tenant of the noisy scenario sends some.
SMOKE = PolicyPlan(
    config=CONFIGS / "cpu-smoke.yaml",
    capacity_tps=20.0,
    budget_s=600.0,
    duration_s=15.0,
    answer_scale=0.5,
    window_s=3.0,
    tpot_estimate_s=0.3,  # 4 sequences sharing ~20 tok/s, with slack for a box shared with other work
    max_in_flight=256,
    start_estimate_s=90.0,
    redeploy_estimate_s=30.0,
    run_overhead_s=6.0,
)


def longest_answer(sc: Scenario) -> int:
    """The largest ``max_tokens`` any tenant of the scenario asks for."""
    return max(t.output.tokens if isinstance(t.output, FixedLength) else t.output.max for t in sc.tenants)


def check_names(policies: tuple[str, ...], scenarios: tuple[str, ...]) -> None:
    bad = [p for p in policies if p not in DISPATCH_POLICIES]
    if bad or not policies:
        raise SystemExit(f"--policies {','.join(policies)!r}: some of {', '.join(DISPATCH_POLICIES)}")
    for name in scenarios:
        load_scenario(name)  # raises ScenarioError naming the shipped ones


def at_capacity(name: str, plan: PolicyPlan, model: str) -> Scenario:
    """Scenario ``name`` with the plan's answer lengths, offering ``load_factor`` × the capacity."""
    base = with_answer_scale(load_scenario(name), plan.answer_scale)
    sc = base.scaled(load_scale(base, plan.capacity_tps, plan.load_factor), plan.duration_s)
    # No drain cap here: the driver sets each run's from the budget left when it starts.
    updates = {"model": model, "drain_timeout_s": None, "max_requests": 1_000_000}
    updates |= {"client_procs": plan.client_procs, "sampling": sampling_for(plan.config)}
    return Scenario.model_validate(sc.model_dump() | updates | {"max_in_flight": plan.max_in_flight})


def sampling_for(config: Path) -> str:
    """The realistic mix, less its JSON schemas where the engine's synthetic tokenizer (random
    weights) cannot constrain output: the replica refuses those (400 invalid_prompt), and the refusals
    counted as misses in every policy's attainment (5 of 85 quiet requests on the H100, 2026-12-05)."""
    engine = load_app_config(config).engine
    return "mix_without_schemas" if engine.synthetic_tokenizer else "mix"


def solo_of(scenario: Scenario) -> Scenario:
    """The same trace without its noisy tenants: each tenant's arrivals and lengths come from its own
    seeded stream (``loadtest.plan.tenant_rng``), so the quiet tenants send exactly the same requests."""
    noisy = NOISY_TENANTS.get(scenario.name, ())
    quiet = [t.model_dump() for t in scenario.tenants if t.id not in noisy]
    return Scenario.model_validate(scenario.model_dump() | {"tenants": quiet})


def quiet_tenants(scenario_name: str, tenants: list[str]) -> list[str]:
    noisy = NOISY_TENANTS.get(scenario_name, ())
    return [t for t in tenants if t not in noisy]
