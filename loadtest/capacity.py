"""Capacity sweep: a scenario (``steady``) at a geometric ladder of rates until the server saturates.

Each rung runs the scenario scaled by ``start_scale × factor^i`` for a short while and is judged
against the rungs before it. A rung is saturated when more than ``max_error_fraction`` of its
requests did not succeed (429s, timeouts, requests the rung's deadline cut), when its TTFT
p99 passes ``max_ttft_p99_s``, or when its output throughput grew less than ``min_growth`` over
the best rung so far although the offer grew by ``factor`` (the plateau). The sweep stops at the
first saturated rung. The capacity is the best achieved throughput of any rung: an overloaded
open-loop server still works at full speed, so a saturated rung measures it too.

Other scenarios are then run at a multiple of that capacity by output tokens (``load_scale``):
the offered output tokens per second, as the scenario's rates and mean ``max_tokens`` give them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from loadtest.records import CUT_ERROR, RequestRecord
from loadtest.run_dir import write_run
from loadtest.runner import run_scenario
from loadtest.scenario import FixedLength, Scenario, load_scenario


class SweepRule(BaseModel):
    """The ladder and the saturation tests."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scenario: str = Field(default="steady", description="Scenario (name or path) whose rates are scaled.")
    model: str | None = Field(default=None, description="Model name sent; None = the scenario's own.")
    start_scale: float = Field(default=1.0, gt=0, description="Scale of the first rung.")
    factor: float = Field(default=1.5, gt=1, description="Scale multiplier from one rung to the next.")
    max_steps: int = Field(default=8, gt=0, description="Rungs at most.")
    step_duration_s: float = Field(default=15.0, gt=0, description="Seconds of new requests per rung.")
    step_drain_s: float = Field(default=5.0, ge=0, description="Cap on a rung's drain; then cut.")
    warmup_fraction: float = Field(default=0.1, ge=0, lt=1, description="Share of a rung left unmeasured.")
    min_growth: float = Field(default=0.1, ge=0, description="Less output growth than this is a plateau.")
    max_ttft_p99_s: float = Field(default=5.0, gt=0, description="A TTFT p99 above this is saturation.")
    max_error_fraction: float = Field(default=0.01, ge=0, lt=1, description="Non-ok share above this.")
    max_in_flight: int = Field(default=2048, gt=0, description="Client connections; keep above the backlog.")
    throughput: Literal["span", "window"] = Field(
        default="span", description="How a rung's achieved output tok/s is taken (module docstring)."
    )


@dataclass(frozen=True)
class StepResult:
    """One rung, reduced to what the saturation tests and the report need."""

    scale: float
    offered_rps: float  # the scenario's nominal request rate at this scale
    requests: int  # measured (warm-up left out)
    ok: int
    not_ok: int  # rejected + failed + cut by the rung's deadline
    achieved_rps: float  # ok / the measured span (first send to last end)
    achieved_tps: float  # output tok/s by the rule's ``throughput``: over the span, or the load window
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    errors: dict[str, int]
    client_cpu: float  # load generator CPU seconds / wall seconds; near 1 the client itself may be the limit
    saturated: str | None = None  # why this rung counts as saturated, or None


def offered_rps(scenario: Scenario) -> float:
    return sum(t.rate or 0.0 for t in scenario.tenants)


def mean_output(spec) -> float:
    return float(spec.tokens) if isinstance(spec, FixedLength) else (spec.min + spec.max) / 2


def offered_output_tps(scenario: Scenario) -> float:
    """Output tokens per second the open-loop tenants ask for (rate × mean max_tokens)."""
    return sum((t.rate or 0.0) * mean_output(t.output) for t in scenario.tenants)


def load_scale(scenario: Scenario, capacity_tps: float, load_factor: float) -> float:
    """The ``--scale`` that makes the scenario offer ``load_factor`` × the capacity in output tokens."""
    offered = offered_output_tps(scenario)
    if offered <= 0:
        raise ValueError(f"{scenario.name}: no open-loop tenant, so no rate to scale")
    return load_factor * capacity_tps / offered


def delivered_tps(records: Sequence[RequestRecord]) -> float:
    """Output tokens/s that arrived between the end of the warm-up and the last send, every request's.

    A chunk of an ok request carries its share of that request's tokens; a chunk of a request that
    did not end ok (cut by the rung's deadline, say) the ok requests' mean tokens per chunk.
    """
    measured = [r.scheduled for r in records if not r.warmup]
    if not measured:
        return 0.0
    start, end = min(measured), max(r.scheduled for r in records)
    if end <= start:
        return 0.0
    ok = [r for r in records if r.ok and r.token_times]
    mean = sum(r.output_tokens for r in ok) / max(1, sum(len(r.token_times) for r in ok))
    total = 0.0
    for r in records:
        per_chunk = r.output_tokens / len(r.token_times) if r.ok and r.token_times else mean
        total += per_chunk * sum(1 for t in r.token_times if start <= t <= end)
    return total / (end - start)


def step_result(
    scale: float, scenario: Scenario, summary: dict, client_cpu: float, window_tps: float | None = None
) -> StepResult:
    """One rung's result; ``window_tps`` (``delivered_tps``) replaces the span throughput when given."""
    o = summary["overall"]
    return StepResult(
        scale=scale,
        offered_rps=offered_rps(scenario),
        requests=o["requests"],
        ok=o["ok"],
        # A request the rung's deadline cut did not finish in the drain: saturation, as a failure is.
        not_ok=o["rejected"] + o["failed"] + o.get("cut", 0),
        achieved_rps=o["request_throughput_rps"],
        achieved_tps=o["output_throughput_tps"] if window_tps is None else window_tps,
        ttft_p50_s=o["ttft_s"]["p50"],
        ttft_p99_s=o["ttft_s"]["p99"],
        tpot_p50_s=o["tpot_s"]["p50"],
        errors=summary["errors"] | ({CUT_ERROR: o["cut"]} if o.get("cut") else {}),
        client_cpu=client_cpu,
    )


def saturation(history: Sequence[StepResult], step: StepResult, rule: SweepRule) -> str | None:
    """Why ``step`` is saturated given the rungs before it, or None."""
    if step.requests == 0:
        return None  # a rung too short for its rate: nothing learnt, the next rung sends more
    if step.ok == 0:
        return "no request succeeded"
    if step.not_ok / step.requests > rule.max_error_fraction:
        top = ", ".join(f"{k} {v}" for k, v in sorted(step.errors.items(), key=lambda kv: -kv[1])[:3])
        return f"{step.not_ok}/{step.requests} requests not ok ({top})"
    if step.ttft_p99_s is not None and step.ttft_p99_s > rule.max_ttft_p99_s:
        return f"TTFT p99 {step.ttft_p99_s:.2f} s > {rule.max_ttft_p99_s:.2f} s"
    best = max((h.achieved_tps for h in history), default=None)
    if best is not None and step.achieved_tps < best * (1 + rule.min_growth):
        return f"output {step.achieved_tps:.1f} tok/s < {1 + rule.min_growth:.2f} × best {best:.1f}"
    return None


def capacity(steps: Sequence[StepResult]) -> dict:
    """The best rung by output throughput; ``saturated`` False means the capacity is a lower bound."""
    best = max(steps, key=lambda s: s.achieved_tps)
    return {
        "capacity_rps": best.achieved_rps,
        "capacity_output_tps": best.achieved_tps,
        "at_scale": best.scale,
        "saturated": any(s.saturated for s in steps),
        "saturated_at_scale": next((s.scale for s in steps if s.saturated), None),
        "reason": next((s.saturated for s in steps if s.saturated), None),
    }


def rung(base: Scenario, scale: float, rule: SweepRule) -> Scenario:
    """The base scenario at ``scale`` for one rung: short, its drain capped at ``step_drain_s`` (what
    the rung's server could not finish by then is cut, and counts toward saturation)."""
    sc = base.scaled(scale, rule.step_duration_s)
    updates = {
        "name": f"{base.name}-x{scale:.3g}",
        "warmup_s": rule.step_duration_s * rule.warmup_fraction,
        "drain_timeout_s": rule.step_drain_s,
        "max_requests": 1_000_000,
        "max_in_flight": rule.max_in_flight,
    } | ({"model": rule.model} if rule.model else {})
    return Scenario.model_validate(sc.model_dump() | updates)


def run_sweep(
    url: str,
    rule: SweepRule,
    out: Path,
    *,
    admin_key: str | None = None,
    should_continue: Callable[[], bool] = lambda: True,
    on_step: Callable[[StepResult], None] | None = None,
) -> dict:
    """Run the ladder against ``url``; each rung's run folder (records, summary) is ``out/step-<i>``."""
    base = load_scenario(rule.scenario)
    steps: list[StepResult] = []
    for i in range(rule.max_steps):
        if steps and not should_continue():
            break
        scale = rule.start_scale * rule.factor**i
        sc = rung(base, scale, rule)
        cpu0, wall0 = time.process_time(), time.monotonic()
        result = run_scenario(sc, url, admin_key=admin_key, show_progress=False)
        cpu = (time.process_time() - cpu0) / max(1e-9, time.monotonic() - wall0)
        summary = write_run(out / f"step-{i}", sc, url, result)
        window = delivered_tps(result.records) if rule.throughput == "window" else None
        step = step_result(scale, sc, summary, cpu, window)
        step = StepResult(**(asdict(step) | {"saturated": saturation(steps, step, rule)}))
        steps.append(step)
        if on_step:
            on_step(step)
        if step.saturated:
            break
    return {"rule": rule.model_dump(), "steps": [asdict(s) for s in steps], **capacity(steps)}


def scenario_scales(capacity_tps: float, load_factor: float, names: Sequence[str]) -> dict[str, float]:
    """``--scale`` per scenario for ``load_factor`` × the capacity (output tokens)."""
    return {n: load_scale(load_scenario(n), capacity_tps, load_factor) for n in names}
