"""What ``fairlane loadtest`` and ``fairlane report`` do; ``cluster/cli.py`` only parses options."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from loadtest.html_report import print_tables
from loadtest.run_dir import write_run
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
