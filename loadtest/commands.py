"""What ``fairlane loadtest`` and ``fairlane report`` do; ``fairlane/cli.py`` only parses options."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from loadtest.capacity import StepResult, SweepRule, run_sweep, scenario_scales
from loadtest.html_report import print_tables
from loadtest.run_dir import write_json, write_run
from loadtest.runner import run_scenario
from loadtest.scenario import load_scenario
from loadtest.tables import fairness_table, summary_table


def run_loadtest(
    scenario: str,
    url: str,
    out: Path,
    *,
    scale: float = 1.0,
    duration_s: float | None = None,
    seed: int | None = None,
    max_requests: int | None = None,
    replicas: int = 1,
    admin_key: str | None = None,
    window_s: float | None = None,
    progress: bool = True,
    console: Console | None = None,
) -> dict:
    """Load, scale and run the scenario; write records.jsonl + summary.json to ``out``; print tables."""
    sc = load_scenario(scenario).scaled(scale, duration_s)
    updates = {k: v for k, v in (("seed", seed), ("max_requests", max_requests)) if v is not None}
    if updates:
        sc = sc.model_validate(sc.model_dump() | updates)
    result = run_scenario(sc, url, replicas=replicas, admin_key=admin_key, show_progress=progress)
    summary = write_run(out, sc, url, result, window_s)
    print_tables([summary_table(summary), fairness_table(summary)], console)
    return summary


SCALED_SCENARIOS = ("steady", "noisy-neighbour", "mixed-sla")


def run_capacity(
    url: str, out: Path, rule: SweepRule, load_factor: float, console: Console | None = None
) -> dict:
    """The capacity sweep; ``out/capacity.json`` also holds each scenario's ``--scale`` at ``load_factor``."""
    console = console or Console()

    def show(s: StepResult) -> None:
        console.print(
            f"scale {s.scale:.3g}: offered {s.offered_rps:.2f} req/s, achieved {s.achieved_rps:.2f} req/s "
            f"({s.achieved_tps:.1f} out tok/s), TTFT p99 {s.ttft_p99_s or 0:.2f}s, "
            f"client CPU {s.client_cpu:.2f}" + (f" [bold]saturated[/]: {s.saturated}" if s.saturated else "")
        )

    result = run_sweep(url, rule, out, on_step=show)
    result["load_factor"] = load_factor
    result["scales"] = scenario_scales(result["capacity_output_tps"], load_factor, SCALED_SCENARIOS)
    write_json(out / "capacity.json", result)
    bound = "" if result["saturated"] else " (never saturated: a lower bound)"
    console.print(
        f"capacity {result['capacity_rps']:.2f} req/s, {result['capacity_output_tps']:.1f} out tok/s{bound}; "
        f"--scale at {load_factor:g}x: " + ", ".join(f"{k} {v:.3g}" for k, v in result["scales"].items())
    )
    return result
