"""The dispatch-policy benchmark's phases in order, fitted to its time budget (``bench.policy_run``).

The phases: the cluster's start (under the first policy); for each policy its redeploy (not the
first's) and its runs, one per scenario, with the noisy scenario's solo run right after it under
``fairlane``; the stop. Each has an estimate from the plan (``PolicyPlan``: a run is its load, its
expected drain and a fixed overhead). When the estimates pass the budget, phases are dropped before
anything starts, least needed first: the solo run (target (a)'s baseline only), then runs from the
last policy's last one backwards, a redeploy with its policy's last run. Every drop is kept with
its reason, so results.json and the table say what was skipped and why. While the benchmark runs,
``drain_cap_s`` gives each run's drain what the phases after it leave over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bench.policy_plan import NOISY_TENANTS, PolicyPlan, at_capacity, solo_of
from loadtest.scenario import Scenario

Kind = Literal["start", "redeploy", "run", "solo", "stop"]


@dataclass(frozen=True, slots=True)
class Phase:
    kind: Kind
    policy: str
    scenario: str | None
    estimate_s: float

    @property
    def label(self) -> str:
        if self.kind in ("run", "solo"):
            return f"{self.policy if self.kind == 'run' else 'solo'}/{self.scenario}"
        return f"{self.kind} ({self.policy})" if self.kind != "stop" else "stop"


@dataclass(frozen=True, slots=True)
class Schedule:
    phases: tuple[Phase, ...]  # what is planned to run, in order
    skipped: tuple[tuple[str, str], ...]  # (phase label, why) of what the budget left out

    def total_s(self) -> float:
        return sum(p.estimate_s for p in self.phases)

    def after_s(self, phase: Phase) -> float:
        """The estimates of the phases planned after ``phase``: what a run's drain must leave them."""
        i = self.phases.index(phase)
        return sum(p.estimate_s for p in self.phases[i + 1 :])

    def as_list(self) -> list[dict]:
        return [{"phase": p.label, "estimate_s": round(p.estimate_s, 1)} for p in self.phases]


def scenario_for(phase: Phase, plan: PolicyPlan, model: str) -> Scenario:
    """The scenario a run phase sends (the solo run: the noisy scenario without its noisy tenants)."""
    if phase.scenario is None:
        raise ValueError(f"{phase.label}: not a run")
    sc = at_capacity(phase.scenario, plan, model)
    return solo_of(sc) if phase.kind == "solo" else sc


def all_phases(plan: PolicyPlan, model: str = "model") -> list[Phase]:
    policies = plan.ordered_policies()
    phases = [Phase("start", policies[0], None, plan.start_estimate_s)]
    for i, policy in enumerate(policies):
        if i > 0:
            phases.append(Phase("redeploy", policy, None, plan.redeploy_estimate_s))
        for name in plan.scenarios:
            phases.append(_run(plan, "run", policy, name, model))
            if policy == "fairlane" and name in NOISY_TENANTS:
                phases.append(_run(plan, "solo", policy, name, model))
    return [*phases, Phase("stop", policies[-1], None, plan.stop_estimate_s)]


def _run(plan: PolicyPlan, kind: Kind, policy: str, name: str, model: str) -> Phase:
    phase = Phase(kind, policy, name, 0.0)
    return Phase(kind, policy, name, plan.run_estimate_s(scenario_for(phase, plan, model)))


def build_schedule(plan: PolicyPlan, model: str = "model") -> Schedule:
    """Every phase, less those the budget cannot hold (``drop_order``), each drop with its reason."""
    phases = all_phases(plan, model)
    skipped: list[tuple[str, str]] = []
    for victim in drop_order(phases):
        total = sum(p.estimate_s for p in phases)
        if total <= plan.budget_s:
            break
        phases.remove(victim)
        skipped.append((victim.label, f"planned {total:.0f}s > the {plan.budget_s:.0f}s budget"))
        redeploy = next((p for p in phases if p.kind == "redeploy" and p.policy == victim.policy), None)
        if redeploy is not None and not any(p.kind == "run" and p.policy == victim.policy for p in phases):
            phases.remove(redeploy)
            skipped.append((redeploy.label, f"no run of {victim.policy} left"))
    return Schedule(tuple(phases), tuple(skipped))


def drop_order(phases: list[Phase]) -> list[Phase]:
    """Least needed first: the solo runs, then the runs from the last backwards."""
    solos = [p for p in phases if p.kind == "solo"]
    runs = [p for p in phases if p.kind == "run"]
    return [*solos, *reversed(runs)]


def drain_cap_s(plan: PolicyPlan, schedule: Schedule, phase: Phase, sc: Scenario, left_s: float) -> float:
    """A run's drain cap: the budget left after its load and the phases planned after it, never below
    its own expected drain (the later phases then give way: they are skipped if they no longer fit),
    and never above ``plan.drain_cap_s`` when given."""
    spare = left_s - sc.duration_s - plan.run_overhead_s - schedule.after_s(phase)
    cap = max(spare, plan.drain_estimate_s(sc))
    return cap if plan.drain_cap_s is None else min(cap, plan.drain_cap_s)
